"""The causes read from the pool's state at dispatch (obs.engine_queue), through the
attribution rule (obs.attribution): a request that waited behind requests of ordinary size is
the engine's queue, one behind prompts longer than usual is prefills_ahead, and the sidecar's
prompt estimate is compared only with itself."""

from __future__ import annotations

from obs.attribution import Baseline, Facts, RunningBaseline, attribute
from obs.config import parse_config

CHAT = parse_config(
    {
        "pools": [{"name": "p", "replicas": ["http://127.0.0.1:1"]}],
        "lanes": [{"name": "chat", "pool": "p", "slo": {"ttft": {"threshold_ms": 300}}}],
        "default_lane": "chat",
    }
).lane("chat")
PHASES_MS = (1.0, 60.0, 1.0, 900.0, 1.0)  # a good request's
# What the lane's good requests found: 51 estimated tokens (request bytes / 4) a request in
# flight ahead, for prompts the engine counts at 23 tokens (a short chat: the estimate also
# counts the request's JSON).
BASE = Baseline(PHASES_MS, prompt_tokens=23.0, ahead_tokens=51.0, in_flight=1.0)


def _miss(phases: tuple[float, ...], **pool: object) -> tuple[str, str]:
    f = Facts(
        "chat", "ok", True, sum(phases), phases, ttft_ms=sum(phases[:3]), prompt_tokens=23,
        **pool,  # type: ignore[arg-type]
    )  # fmt: skip
    (m,) = attribute(f, CHAT, BASE)
    return m.phase, m.cause


def test_a_pool_over_its_slots_while_in_flight_is_the_engine_queue() -> None:
    """A prefill miss that found a slot free at dispatch, on a replica sent more requests of
    ordinary size meanwhile than it has slots, is the pool saturated (engine_queue); the same
    arrivals carrying prompts twice the usual are prefills_ahead; none at all, other."""
    prefill = (1.0, 580.0, 1.0, 900.0, 1.0)
    free = {"pool_in_flight": 1, "pool_max_running": 2, "pool_ahead_prompt_tokens": 51}
    crowd = {"pool_requests_during": 3, "pool_prompt_tokens_during": 3 * 51}
    assert _miss(prefill, **free, **crowd) == ("prefill", "engine_queue")
    long = {"pool_requests_during": 3, "pool_prompt_tokens_during": 3 * 400}
    assert _miss(prefill, **free, **long) == ("prefill", "prefills_ahead")
    alone = {"pool_requests_during": 0, "pool_prompt_tokens_during": 0}
    assert _miss(prefill, **free, **alone) == ("prefill", "other")


def test_a_queued_request_behind_ordinary_prompts_is_the_engine_queue() -> None:
    """A request that waited for a slot behind requests of the usual size is the engine's
    queue, though the estimate ahead (51 a request) is more than the engine's count of its
    own prompt (23): prompts ahead are compared with what the lane's good requests found
    ahead, in the same estimate; twice that is prefills_ahead."""
    queued = (700.0, 60.0, 1.0, 900.0, 1.0)
    slots = {"pool_max_running": 2, "engine_queue_ms": 690.0}
    usual = {"pool_in_flight": 9, "pool_ahead_prompt_tokens": 9 * 51}
    assert _miss(queued, **slots, **usual) == ("queue", "engine_queue")
    long = {"pool_in_flight": 9, "pool_ahead_prompt_tokens": 9 * 120}
    assert _miss(queued, **slots, **long) == ("queue", "prefills_ahead")


def test_an_own_prompt_further_above_usual_than_those_ahead_is_not_prefills_ahead() -> None:
    """Prompts ahead 2.2x the usual estimate, behind a request whose own prompt is 2.6x the
    usual count: each is judged against its own usual, its own is the longer, so the wait
    is the engine's queue (an estimate against a count would have said prefills_ahead)."""
    f = Facts(
        "chat", "ok", True, 800.0, (700.0, 60.0, 1.0, 38.0, 1.0), ttft_ms=761.0,
        prompt_tokens=60, engine_queue_ms=690.0, pool_in_flight=2, pool_max_running=2,
        pool_ahead_prompt_tokens=2 * 112,
    )  # fmt: skip
    (m,) = attribute(f, CHAT, BASE)
    assert (m.phase, m.cause) == ("queue", "engine_queue")


def test_the_engine_wait_baseline_counts_every_good_request() -> None:
    """The good requests' engine wait is averaged over all of them (one that waited for no
    slot waited 0), as their queue phase is, so a queued miss whose queue phase is all the
    engine's wait is engine_queue, never admission_queue."""
    run = RunningBaseline()
    for eq, queue in ((None, 1.0), (None, 1.0), (200.0, 201.0)):
        run.add(Facts("chat", "ok", True, 300.0, (queue, 60.0, 1.0, 200.0, 1.0), 62.0, None,
                      engine_queue_ms=eq))  # fmt: skip
    base = run.snapshot()
    assert base.engine_queue_ms is not None and abs(base.engine_queue_ms - 200.0 / 3) < 1e-9
    f = Facts(
        "chat", "ok", True, 700.0, (325.0, 60.0, 1.0, 300.0, 1.0), ttft_ms=386.0,
        engine_queue_ms=324.0, pool_in_flight=3, pool_max_running=2, pool_ahead_prompt_tokens=150,
    )  # fmt: skip
    (m,) = attribute(f, CHAT, base)
    assert (m.phase, m.cause) == ("queue", "engine_queue")
