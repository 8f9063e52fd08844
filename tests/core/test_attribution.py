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
from obs.engine_queue import infer
from obs.events import Event
from obs.phases import Clock
from obs.record import Finished, fill_timings
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
    pool_in_flight=st.none() | st.integers(0, 64),
    pool_max_running=st.none() | st.integers(1, 64),
    pool_waiting=st.none() | st.integers(0, 64),
    pool_kv_usage=st.none() | st.floats(0, 1),
    pool_preempting=st.none() | st.booleans(),
    pool_ahead_prompt_tokens=st.none() | st.integers(0, 10**6),
    pool_prompt_tokens_during=st.none() | st.integers(0, 10**6),
    pool_requests_during=st.none() | st.integers(0, 64),
)
base_st = st.builds(
    Baseline,
    phases_ms=st.tuples(*[phase_ms] * len(PHASES)),
    prompt_tokens=st.none() | st.floats(0, 1e6),
    cache_hit_ratio=st.none() | st.floats(0, 1),
    engine_queue_ms=st.none() | phase_ms,
    ahead_tokens=st.none() | st.floats(0, 1e6),
    in_flight=st.none() | st.floats(0, 64),
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


SATURATED = {"pool_in_flight": 2, "pool_max_running": 2, "pool_ahead_prompt_tokens": 60}


def test_engine_wait_is_named_by_the_pool_state_at_dispatch() -> None:
    """An engine wait behind the queue's excess is kv_pressure when the KV cache was near full
    or preempting, prefills_ahead when the prompts in flight were many times this one's, else
    engine_queue (the pool was saturated)."""
    kw = {"phases": (900.0, 100.0, 1.0, 300.0, 1.0), "ttft_ms": 1001.0, "engine_queue_ms": 850.0}
    assert only(facts(**kw, **SATURATED)) == ("ttft", "queue", "engine_queue")
    kv = facts(**kw, **SATURATED, pool_kv_usage=0.95)
    assert only(kv) == ("ttft", "queue", "kv_pressure")
    assert only(facts(**kw, **SATURATED, pool_preempting=True))[2] == "kv_pressure"
    long_ahead = {**SATURATED, "pool_ahead_prompt_tokens": 2 * 3000}
    assert only(facts(**kw, **long_ahead, prompt_tokens=40)) == ("ttft", "queue", "prefills_ahead")


def test_prefill_miss_of_a_queued_request_is_the_engine_queue() -> None:
    """A prefill miss with no long prompt or cache miss is the engine's queue when every slot
    was taken at dispatch (or the engine had waiting requests), prefills_ahead behind long
    prompts, and other only when the pool's state explains nothing."""
    kw = {"phases": (10.0, 900.0, 1.0, 300.0, 1.0), "ttft_ms": 911.0, "prompt_tokens": 50}
    assert only(facts(**kw, **SATURATED)) == ("ttft", "prefill", "engine_queue")
    assert only(facts(**kw, pool_waiting=3)) == ("ttft", "prefill", "engine_queue")
    ahead = {"pool_in_flight": 1, "pool_max_running": 2, "pool_ahead_prompt_tokens": 4000}
    assert only(facts(**kw, **ahead)) == ("ttft", "prefill", "prefills_ahead")
    idle = {"pool_in_flight": 0, "pool_max_running": 2, "pool_waiting": 0}
    assert only(facts(**kw, **idle)) == ("ttft", "prefill", "other")


def test_tpot_miss_under_kv_pressure() -> None:
    """A decode miss on a replica whose engine was preempting is kv_pressure, not other."""
    f = facts(phases=(10.0, 100.0, 1.0, 3000.0, 1.0), tpot_ms=90.0, pool_preempting=True)
    assert only(f) == ("tpot", "decode", "kv_pressure")


def _dispatched(prefill_ms: float, **pool: object) -> Finished:
    ev = Event(lane="chat", stream=True, **pool)  # type: ignore[arg-type]
    ms = 1_000_000
    clock = Clock(received=1, dispatched=1 + 5 * ms)
    clock.first_up = clock.dispatched + int(prefill_ms * ms)
    clock.first_sent, clock.last_up = clock.first_up + ms, clock.first_up + 50 * ms
    clock.end = clock.last_up + ms
    f = Finished(ev, clock, 0, new_ids(None))
    fill_timings(f)
    return f


def test_inferred_engine_queue_moves_the_wait_out_of_prefill() -> None:
    """With every slot taken at dispatch and no engine span, the prefill beyond the lane's
    usual becomes the engine's queue (engine_view inferred); phases still sum to e2e."""
    f = _dispatched(700.0, pool_in_flight=2, pool_max_running=2)
    e2e = f.event.e2e_ms
    assert infer(f, base_prefill_ms=40.0)
    ev = f.event
    assert (ev.engine_view, ev.engine_queue_ms) == ("inferred", 660.0)
    assert (ev.queue_ms, ev.prefill_ms) == (665.0, 40.0)
    total = ev.queue_ms + ev.prefill_ms + ev.first_token_ms + ev.decode_ms + ev.stream_ms
    assert abs(total - e2e) < 0.01 and ev.e2e_ms == e2e


def test_no_inference_with_a_slot_free_or_a_span_joined() -> None:
    """A request dispatched with a slot free, or one whose engine span was joined, keeps its
    phases: the span wins, and an idle pool says nothing of a wait."""
    free = _dispatched(700.0, pool_in_flight=1, pool_max_running=2)
    assert not infer(free, 40.0) and free.event.engine_view == "absent"
    joined = _dispatched(700.0, pool_in_flight=5, pool_max_running=2, engine_view="joined")
    assert not infer(joined, 40.0) and joined.event.prefill_ms == 700.0


def test_stamp_infers_before_judging() -> None:
    """The sidecar's step splits a saturated pool's wait from prefill, then charges the miss
    to the engine's queue instead of prefill / other."""
    stamp = MissStamp(CONFIG)
    for _ in range(3):
        stamp.on_end(_dispatched(40.0, pool_in_flight=0, pool_max_running=2))
    f = _dispatched(900.0, pool_in_flight=4, pool_max_running=2, prompt_tokens=20)
    stamp.on_end(f)
    ev = f.event
    assert ev.engine_view == "inferred" and ev.engine_queue_ms is not None
    assert (ev.miss_slo, ev.miss_phase, ev.miss_cause) == ("ttft", "queue", "engine_queue")


def test_prefills_ahead_is_judged_against_what_the_lanes_good_requests_found_ahead() -> None:
    """With a baseline of what the lane's good requests found in flight ahead of them, prompts
    ahead at least twice that (and longer than the request's own) are prefills_ahead; the
    same prompts ahead as usual are a saturated pool, engine_queue."""
    base = Baseline(BASE.phases_ms, prompt_tokens=400, ahead_tokens=500.0)
    kw = {"phases": (900.0, 100.0, 1.0, 300.0, 1.0), "ttft_ms": 1001.0, "engine_queue_ms": 850.0}
    burst = facts(**kw, pool_in_flight=30, pool_max_running=8, pool_ahead_prompt_tokens=36_000)
    assert only(burst, base) == ("ttft", "queue", "prefills_ahead")
    usual = facts(**kw, pool_in_flight=30, pool_max_running=8, pool_ahead_prompt_tokens=15_000)
    assert only(usual, base) == ("ttft", "queue", "engine_queue")
    longer_own = facts(
        **kw, **{"pool_in_flight": 30, "pool_ahead_prompt_tokens": 36_000}, prompt_tokens=1500
    )
    assert only(longer_own, base)[2] == "engine_queue"
    run = RunningBaseline()
    run.add(facts(pool_in_flight=4, pool_ahead_prompt_tokens=2000))
    run.add(facts(pool_in_flight=0, pool_ahead_prompt_tokens=0))
    assert run.snapshot().ahead_tokens == 500.0


def test_tpot_miss_on_a_saturated_pool_is_named_by_the_prompts_ahead() -> None:
    """A decode miss on a replica whose slots were all taken at dispatch (the requests it
    admits next prefill in the same steps) is the engine's queue behind prompts of ordinary
    size, prefills_ahead behind prompts longer than usual; on an idle one, other."""
    kw = {"phases": (10.0, 100.0, 1.0, 3000.0, 1.0), "tpot_ms": 90.0}
    base = Baseline(BASE.phases_ms, prompt_tokens=50, ahead_tokens=30.0)
    assert only(facts(**kw, **SATURATED), base) == ("tpot", "decode", "engine_queue")
    long_ahead = {**SATURATED, "pool_ahead_prompt_tokens": 2 * 300}
    assert only(facts(**kw, **long_ahead), base) == ("tpot", "decode", "prefills_ahead")
    assert only(facts(**kw, pool_in_flight=0, pool_max_running=2))[2] == "other"


def test_a_batch_heavier_than_usual_is_prefills_ahead() -> None:
    """A prefill or decode miss with a slot free, on a replica whose requests in flight carried
    at least twice the prompt tokens per request the lane's good requests found in flight:
    prefills_ahead; a batch as heavy as usual: other."""
    base = Baseline(BASE.phases_ms, prompt_tokens=100, ahead_tokens=600.0)
    free = {"pool_in_flight": 5, "pool_max_running": 32}
    prefill = {"phases": (10.0, 900.0, 1.0, 300.0, 1.0), "ttft_ms": 911.0, "prompt_tokens": 90}
    assert only(facts(**prefill, **free, pool_ahead_prompt_tokens=7000), base)[2] == (
        "prefills_ahead"
    )
    assert only(facts(**prefill, **free, pool_ahead_prompt_tokens=3500), base)[2] == "other"
    decode = {"phases": (10.0, 100.0, 1.0, 3000.0, 1.0), "tpot_ms": 90.0}
    assert only(facts(**decode, **free, pool_ahead_prompt_tokens=7000), base) == (
        "tpot", "decode", "prefills_ahead"
    )  # fmt: skip


def test_a_saturated_pool_without_a_queue_is_still_the_engine_queue() -> None:
    """A prefill miss whose joined span shows the engine's own queue and prefill were short
    (the request waited before the scheduler, in the engine's API server), or a miss on a
    replica with 1.5x the requests in flight the lane's good requests found, is the pool
    saturated (engine_queue), not other."""
    base = Baseline(BASE.phases_ms, prompt_tokens=100, ahead_tokens=600.0, in_flight=8.0)
    kw = {"phases": (10.0, 900.0, 1.0, 300.0, 1.0), "ttft_ms": 911.0, "prompt_tokens": 90}
    held = facts(**kw, engine_view="joined", engine_queue_ms=5.0, engine_prefill_ms=40.0)
    assert only(held, base) == ("ttft", "prefill", "engine_queue")
    slow_engine = facts(**kw, engine_view="joined", engine_queue_ms=5.0, engine_prefill_ms=700.0)
    assert only(slow_engine, base)[2] == "other"
    crowded = facts(**kw, pool_in_flight=13, pool_max_running=32, pool_ahead_prompt_tokens=4000)
    assert only(crowded, base)[2] == "engine_queue"
