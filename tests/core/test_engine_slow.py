"""The engine_slow cause (obs.engine_queue.engine_slow, through obs.attribution's rule): with the
engine's span joined, a miss whose engine computed its prefill (or decode) at least twice as
slowly per token as the lane's good requests, with no queue and no long prompts ahead to say
why, is engine_slow; per token, so a long prompt at the usual pace is not."""

from __future__ import annotations

from obs.attribution import Attributor, Baseline, Facts, RunningBaseline, attribute
from obs.config import parse_config
from obs.engine_queue import SLOW_FACTOR, engine_slow

CHAT = parse_config(
    {
        "pools": [{"name": "p", "replicas": ["http://127.0.0.1:1"]}],
        "lanes": [
            {
                "name": "chat",
                "pool": "p",
                "slo": {"ttft": {"threshold_ms": 500}, "tpot": {"threshold_ms": 50}},
            }
        ],
        "default_lane": "chat",
    }
).lane("chat")
GOOD_PHASES = (10.0, 100.0, 1.0, 300.0, 1.0)
# The lane's good requests: 50-token prompts prefilled in 80 ms by the engine (1.6 ms a
# token), 31 output tokens decoded in 300 ms (10 ms a token after the first).
BASE = Baseline(
    GOOD_PHASES, prompt_tokens=50, ahead_tokens=60.0, in_flight=1.0,
    prefill_per_token=1.6, decode_per_token=10.0,
)  # fmt: skip
FREE = {"pool_in_flight": 1, "pool_max_running": 32, "pool_ahead_prompt_tokens": 60}
SLOW_PREFILL = (10.0, 900.0, 1.0, 300.0, 1.0)  # TTFT 911 ms, threshold 500


def _facts(
    phases: tuple[float, ...] = SLOW_PREFILL, *, tpot_ms: float = 10.0, **kw: object
) -> Facts:
    fields: dict[str, object] = {"engine_view": "joined", "prompt_tokens": 60, **FREE}
    fields.update(kw)
    return Facts(
        "chat", "ok", True, sum(phases), phases, ttft_ms=sum(phases[:3]), tpot_ms=tpot_ms,
        **fields,  # type: ignore[arg-type]
    )  # fmt: skip


def _cause(f: Facts, base: Baseline = BASE) -> tuple[str, str, str]:
    (m,) = attribute(f, CHAT, base)
    return m.slo, m.phase, m.cause


def test_a_slow_prefill_per_token_is_engine_slow() -> None:
    """A 60-token prompt (the lane's usual size) the engine prefilled in 800 ms (13 ms a token,
    8x the lane's 1.6), a slot free and nothing long ahead: engine_slow. The same miss without
    the engine's span (no view, or the queue inferred) names nothing: other."""
    assert _cause(_facts(engine_prefill_ms=800.0)) == ("ttft", "prefill", "engine_slow")
    for view in ("absent", "inferred"):
        assert _cause(_facts(engine_view=view, engine_prefill_ms=800.0))[2] == "other"
    assert _cause(_facts(engine_prefill_ms=800.0), Baseline(GOOD_PHASES, prompt_tokens=50))[2] == (
        "other"
    )  # no good request with a joined span: no pace to compare with


def test_a_long_prompt_at_the_usual_pace_is_long_prefill() -> None:
    """A 500-token prompt (10x the lane's) prefilled in 800 ms, 1.6 ms a token as the lane's
    good requests: long_prefill, and engine_slow does not hold (per token it is the usual)."""
    long = _facts(prompt_tokens=500, engine_prefill_ms=800.0)
    assert _cause(long) == ("ttft", "prefill", "long_prefill")
    assert not engine_slow(long, BASE, "prefill", 800.0)


def test_only_the_tokens_the_engine_computed_count() -> None:
    """A 500-token prompt of which 440 came from the prefix cache, prefilled in 800 ms: 60
    tokens computed, 13 ms each: slow. With no cached tokens, 1.6 ms each: not slow."""
    cached = _facts(prompt_tokens=500, cached_tokens=440, engine_prefill_ms=800.0)
    assert engine_slow(cached, BASE, "prefill", 800.0)
    uncached = _facts(prompt_tokens=500, engine_prefill_ms=800.0)
    assert not engine_slow(uncached, BASE, "prefill", 800.0)


def test_a_queued_request_stays_the_engine_queue() -> None:
    """A slow engine prefill on a replica whose slots were all taken at dispatch is the
    engine's queue; behind prompts longer than usual in flight, prefills_ahead: the queue
    and the prompts ahead explain it first."""
    queued = _facts(engine_prefill_ms=800.0, pool_in_flight=32, pool_max_running=32)
    assert _cause(queued) == ("ttft", "prefill", "engine_queue")
    ahead = _facts(engine_prefill_ms=800.0, pool_ahead_prompt_tokens=600)
    assert _cause(ahead)[2] == "prefills_ahead"
    waited = _facts((700.0, 100.0, 1.0, 300.0, 1.0), engine_queue_ms=690.0, engine_prefill_ms=90.0)
    assert _cause(waited) == ("ttft", "queue", "engine_queue")


def test_a_slow_pace_that_explains_little_of_the_miss_is_not_engine_slow() -> None:
    """A prefill 2x the usual pace (420 ms for 60 tokens at 3.5 ms usual: 210 ms beyond the
    pace) explains under half of the phase's 800 ms excess: other, not engine_slow."""
    base = Baseline(GOOD_PHASES, prompt_tokens=50, ahead_tokens=60.0, prefill_per_token=3.5)
    assert SLOW_FACTOR * 3.5 * 60 == 420.0
    assert _cause(_facts(engine_prefill_ms=420.0), base)[2] == "other"


def test_a_slow_decode_per_token_is_engine_slow() -> None:
    """A TPOT miss whose engine decoded 31 tokens in 2,900 ms (97 ms a token, 10x the lane's
    10): engine_slow; decoded at the lane's pace (the time went elsewhere): other."""
    decode = (10.0, 100.0, 1.0, 3000.0, 1.0)
    kw = {"tpot_ms": 100.0, "completion_tokens": 31}
    slow = _facts(decode, engine_prefill_ms=80.0, engine_decode_ms=2900.0, **kw)
    assert _cause(slow) == ("tpot", "decode", "engine_slow")
    usual = _facts(decode, engine_prefill_ms=80.0, engine_decode_ms=300.0, **kw)
    assert _cause(usual) == ("tpot", "decode", "other")


def test_the_baselines_learn_the_engines_pace_from_joined_good_requests() -> None:
    """The running baseline's paces are the mean per-token prefill (tokens computed: the
    prompt less its cached tokens) and decode of good requests with a joined span; inferred
    ones do not count. The sidecar's Attributor then names a slow one engine_slow."""
    run = RunningBaseline()
    run.add(
        _facts(GOOD_PHASES, engine_prefill_ms=96.0, engine_decode_ms=300.0, completion_tokens=31)
    )
    run.add(_facts(GOOD_PHASES, prompt_tokens=100, cached_tokens=60, engine_prefill_ms=80.0))
    run.add(_facts(GOOD_PHASES, engine_view="inferred", engine_prefill_ms=900.0))
    snap = run.snapshot()
    assert (snap.prefill_per_token, snap.decode_per_token) == (1.8, 10.0)
    att = Attributor({"chat": CHAT})
    for _ in range(10):
        assert att.judge(_facts(GOOD_PHASES, engine_prefill_ms=96.0)) == ()
    (m,) = att.judge(_facts(engine_prefill_ms=800.0))
    assert m.cause == "engine_slow"
