"""The SLO miss attribution rule (obs.attribution): unit and property tests."""

from __future__ import annotations

import statistics

from hypothesis import given
from hypothesis import strategies as st

from obs.attribution import (
    BASELINE_REQUESTS,
    Attributor,
    Baseline,
    Facts,
    MissStamp,
    RunningBaseline,
    attribute,
    excess,
    missed,
)
from obs.config import parse_config
from obs.conventions import MISS_CAUSES, OUTCOMES, PHASES, SLO_KINDS
from obs.events import Event
from obs.phases import Clock
from obs.record import Finished
from obs.tracecontext import new_ids

CONFIG = parse_config(
    {
        "pools": [{"name": "p", "replicas": ["http://127.0.0.1:1"]}],
        "lanes": [
            {
                "name": "chat",
                "pool": "p",
                "slo": {
                    "ttft": {"threshold_ms": 500, "objective": 0.9},
                    "tpot": {"threshold_ms": 50, "objective": 0.9},
                    "availability": {"objective": 0.99},
                },
            },
            {"name": "free", "pool": "p"},
        ],
        "default_lane": "chat",
    }
)
CHAT = CONFIG.lane("chat")
BASE = Baseline((10.0, 100.0, 1.0, 300.0, 1.0), prompt_tokens=50, cache_hit_ratio=0.9)


def facts(**kw: object) -> Facts:
    phases = kw.pop("phases", (10.0, 100.0, 1.0, 300.0, 1.0))
    assert isinstance(phases, tuple)
    base: dict[str, object] = {
        "lane": "chat",
        "status": "ok",
        "stream": True,
        "e2e_ms": sum(phases),
        "phases_ms": phases,
        "ttft_ms": sum(phases[:3]),
        "tpot_ms": 10.0,
    }
    base.update(kw)
    return Facts(**base)  # type: ignore[arg-type]


def only(f: Facts, base: Baseline = BASE) -> tuple[str, str, str]:
    (m,) = attribute(f, CHAT, base)
    return m.slo, m.phase, m.cause


def test_good_request_has_no_miss() -> None:
    """A request within every gate of its lane is charged nothing."""
    assert attribute(facts(), CHAT, BASE) == ()


def test_admission_queue_wait_is_charged_to_the_queue() -> None:
    """A TTFT miss whose time went into waiting for admission: queue / admission_queue."""
    f = facts(phases=(900.0, 100.0, 1.0, 300.0, 1.0), ttft_ms=1001.0)
    assert only(f) == ("ttft", "queue", "admission_queue")


def test_engine_wait_in_the_queue_phase_is_the_engine_queue() -> None:
    """The engine view moves the engine's wait into the queue phase: when it explains at
    least half the queue's excess, queue / engine_queue; a smaller share stays admission."""
    waited = facts(phases=(900.0, 100.0, 1.0, 300.0, 1.0), ttft_ms=1001.0, engine_queue_ms=850.0)
    assert only(waited) == ("ttft", "queue", "engine_queue")
    gate = facts(phases=(900.0, 100.0, 1.0, 300.0, 1.0), ttft_ms=1001.0, engine_queue_ms=300.0)
    assert only(gate) == ("ttft", "queue", "admission_queue")


def test_refused_connection_is_an_upstream_error() -> None:
    """A pool that refuses connections fails the request in the queue: upstream_error."""
    f = facts(
        status="error", ttft_ms=None, tpot_ms=None, error_class="upstream_connect",
        error_phase="queue", rejection_reason="pool_unavailable", phases=(3.0, 0, 0, 0, 0),
    )  # fmt: skip
    assert only(f) == ("availability", "queue", "upstream_error")


def test_failure_cause_from_error_class() -> None:
    """A stream ended on a client that read nothing is slow_client; a sidecar fault other."""
    slow = facts(status="error", tpot_ms=None, error_class="slow_client", error_phase="decode")
    assert only(slow) == ("availability", "decode", "slow_client")
    internal = facts(status="error", tpot_ms=None, error_class="internal", error_phase="prefill")
    assert only(internal) == ("availability", "prefill", "other")


def test_prefill_causes_in_order() -> None:
    """Slow prefill: long prompt, then cache miss (the engine's wait is not prefill)."""
    slow = (10.0, 900.0, 1.0, 300.0, 1.0)
    ttft = 911.0
    long = facts(phases=slow, ttft_ms=ttft, engine_queue_ms=700.0, prompt_tokens=500)
    assert only(long) == ("ttft", "prefill", "long_prefill")
    miss = facts(phases=slow, ttft_ms=ttft, prompt_tokens=60, cache_hit=False)
    assert only(miss) == ("ttft", "prefill", "cache_miss")
    seldom = Baseline(BASE.phases_ms, prompt_tokens=50, cache_hit_ratio=0.1)
    assert only(miss, seldom) == ("ttft", "prefill", "other")


def test_tpot_miss_on_a_blocked_stream_is_the_slow_client() -> None:
    """A TPOT miss while the relay waited on the client: decode / slow_client."""
    f = facts(phases=(10.0, 100.0, 1.0, 3000.0, 1.0), tpot_ms=80.0, stream_blocked_ms=2500.0)
    assert only(f) == ("tpot", "decode", "slow_client")
    engine = facts(phases=(10.0, 100.0, 1.0, 3000.0, 1.0), tpot_ms=80.0)
    assert only(engine) == ("tpot", "decode", "other")


def test_non_streamed_request_judged_on_e2e() -> None:
    """A non-streamed answer's TTFT is its e2e: every phase is a candidate."""
    f = facts(stream=False, ttft_ms=None, tpot_ms=None, phases=(10.0, 100.0, 1.0, 1.0, 900.0))
    assert only(f) == ("ttft", "stream", "slow_client")


def test_lane_without_slos_or_unknown_misses_nothing() -> None:
    """Lanes that declare no SLO (or that the config lacks) never miss."""
    f = facts(lane="free", status="error", error_class="upstream_connect")
    assert missed(f, CONFIG.lane("free")) == ()
    assert missed(f, None) == ()


def test_attributor_learns_only_from_good_requests() -> None:
    """The running baseline moves with good requests; a bad one is judged against it."""
    att = Attributor({"chat": CHAT})
    for _ in range(20):
        assert att.judge(facts(phases=(10.0, 400.0, 1.0, 100.0, 1.0), ttft_ms=411.0)) == ()
    # Queue 100 ms over a 10 ms norm, prefill 450 over a 400 ms norm: prefill's excess is
    # smaller, so the queue is charged although prefill took longer.
    (m,) = att.judge(facts(phases=(110.0, 450.0, 1.0, 100.0, 1.0), ttft_ms=561.0))
    assert (m.phase, m.cause) == ("queue", "admission_queue")


phase_ms = st.floats(0, 1e5, allow_nan=False)
fact_st = st.builds(
    Facts,
    lane=st.sampled_from(["chat", "free", "unknown"]),
    status=st.sampled_from(OUTCOMES),
    stream=st.booleans(),
    e2e_ms=phase_ms,
    phases_ms=st.tuples(*[phase_ms] * len(PHASES)),
    ttft_ms=st.none() | phase_ms,
    tpot_ms=st.none() | st.floats(0, 1000, allow_nan=False),
    error_class=st.sampled_from([None, "upstream_connect", "slow_client", "internal"]),
    error_phase=st.sampled_from([None, *PHASES]),
    prompt_tokens=st.none() | st.integers(0, 10**6),
    cache_hit=st.none() | st.booleans(),
    engine_queue_ms=st.none() | phase_ms,
    stream_blocked_ms=phase_ms,
)
base_st = st.builds(
    Baseline,
    phases_ms=st.tuples(*[phase_ms] * len(PHASES)),
    prompt_tokens=st.none() | st.floats(0, 1e6),
    cache_hit_ratio=st.none() | st.floats(0, 1),
    engine_queue_ms=st.none() | phase_ms,
)


@given(fact_st, base_st)
def test_every_miss_is_named_from_the_fixed_enums(f: Facts, base: Baseline) -> None:
    """One attribution per missed gate; slo, phase and cause always come from the enums."""
    lane = CONFIG.lane(f.lane) if f.lane in CONFIG.lane_names else None
    misses = attribute(f, lane, base)
    assert tuple(m.slo for m in misses) == missed(f, lane)
    for m in misses:
        assert m.slo in SLO_KINDS and m.phase in PHASES and m.cause in MISS_CAUSES


@given(fact_st, base_st)
def test_latency_miss_goes_to_the_phase_with_the_largest_excess(f: Facts, base: Baseline) -> None:
    """A latency miss is charged to the gate's phase that ran furthest over the baseline."""
    for m in attribute(f, CHAT, base):
        if m.slo == "availability":
            continue
        phases: tuple[str, ...] = ("first_token", "decode") if m.slo == "tpot" else PHASES
        if m.slo == "ttft" and f.ttft_ms is not None:
            phases = PHASES[:3]
        assert m.phase in phases
        assert excess(f, m.phase, base) == max(excess(f, p, base) for p in phases)


@given(st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=BASELINE_REQUESTS))
def test_running_baseline_is_the_mean_until_it_is_full(values: list[float]) -> None:
    """Up to BASELINE_REQUESTS good requests, each phase's baseline is their plain mean."""
    run = RunningBaseline()
    for v in values:
        run.add(facts(phases=(v, v, v, v, v), prompt_tokens=int(v)))
    snap = run.snapshot()
    mean = statistics.fmean(values)
    assert all(abs(p - mean) <= 1e-6 * max(1.0, mean) for p in snap.phases_ms)
    assert snap.cache_hit_ratio is None


def test_running_baseline_forgets_old_requests() -> None:
    """Past BASELINE_REQUESTS, the baseline follows a shift in what good requests take."""
    run = RunningBaseline()
    for _ in range(BASELINE_REQUESTS):
        run.add(facts(phases=(10.0,) * 5))
    for _ in range(5 * BASELINE_REQUESTS):
        run.add(facts(phases=(100.0,) * 5))
    assert run.snapshot().phases_ms[0] > 99.0


def _finished(ev: Event) -> Finished:
    return Finished(ev, Clock(received=1), 0, new_ids(None))


def test_stamp_sets_event_fields_only_for_misses() -> None:
    """The sidecar's step stamps miss_slo/phase/cause on a miss and leaves a good one null."""
    stamp = MissStamp(CONFIG)
    good = Event(lane="chat", stream=True, ttft_ms=100.0, tpot_ms=10.0, queue_ms=1.0)
    f = _finished(good)
    stamp.on_end(f)
    assert (good.miss_slo, good.miss_phase, good.miss_cause, f.misses) == (None, None, None, ())
    bad = Event(lane="chat", stream=True, ttft_ms=900.0, tpot_ms=90.0, queue_ms=880.0)
    bad.decode_ms = 2000.0
    f = _finished(bad)
    stamp.on_end(f)
    assert (bad.miss_slo, bad.miss_phase, bad.miss_cause) == (
        "ttft,tpot",
        "queue",
        "admission_queue",
    )
    assert f.misses == (("ttft", "queue", "admission_queue"), ("tpot", "decode", "other"))
