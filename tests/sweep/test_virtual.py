"""Virtual time for the stress replay (obs.sweep.virtual): the jumping clock, the sidecar's
admission gate on it, and a simulated replica stepped by its timers."""

from __future__ import annotations

import asyncio

import pytest

from obs.config import Admission, Lane
from obs.engines.sim.frontend import FrontEnd, FrontEndCost
from obs.engines.sim.hardware import StepWork, perf_model
from obs.engines.sim.scheduler import SchedulerConfig, SimRequest
from obs.sidecar.outcomes import Refusal
from obs.sidecar.policy.admission import LaneGate, Ticket
from obs.sweep.virtual import VirtualLoop, VirtualReplica, gap_percentile

H100 = perf_model("H100", "llama-3.1-8b")


def test_an_hour_of_virtual_sleep_takes_no_real_time() -> None:
    """Timers fire in order at their virtual times; the clock jumps instead of waiting (an
    hour's sleep that waited would not finish: the run has no such time)."""
    loop = VirtualLoop()
    fired: list[tuple[str, float]] = []

    async def sleeper(name: str, s: float) -> None:
        await asyncio.sleep(s)
        fired.append((name, loop.time()))

    async def both() -> None:
        await asyncio.gather(sleeper("late", 3600.0), sleeper("early", 1.5))

    loop.run_until_complete(both())
    loop.close()
    assert fired == [("early", 1.5), ("late", 3600.0)]


def test_the_sidecars_queue_timeout_runs_in_virtual_seconds() -> None:
    """A lane with one slot: the second request waits in the queue and is refused with
    queue_timeout exactly when its virtual timeout passes; the third finds the queue full."""
    lane = Lane(
        name="l", pool="p", admission=Admission(max_concurrency=1, max_queue=1, queue_timeout_s=5)
    )
    gate = LaneGate(lane)
    loop = VirtualLoop()
    outcomes: dict[str, tuple[str, float]] = {}

    async def one(name: str, at: float, hold: float) -> None:
        await asyncio.sleep(at)
        ticket = Ticket("t", 1)
        r = await gate.admit(ticket)
        if isinstance(r, Refusal):
            outcomes[name] = (r.reason or "", loop.time())
            return
        await asyncio.sleep(hold)
        gate.release(ticket)
        outcomes[name] = ("ok", loop.time())

    async def four() -> None:
        await asyncio.gather(one("a", 0, 10), one("b", 1, 1), one("c", 2, 1), one("d", 12, 1))

    loop.run_until_complete(four())
    loop.close()
    assert outcomes["a"] == ("ok", 10)
    assert outcomes["b"] == ("queue_timeout", 6)
    assert outcomes["c"][0] == "queue_full"
    assert outcomes["d"] == ("ok", 13)


def test_a_replica_takes_the_modelled_time_and_batches_a_second_request() -> None:
    """One request alone: first token after one prefill step of the model, then one decode
    step per token; a second request that arrives mid-run joins the batch and both finish."""
    loop = VirtualLoop()
    replica = VirtualReplica(loop, H100, SchedulerConfig())
    a = SimRequest("a", 1000, 50)
    b = SimRequest("b", 200, 10)

    async def run() -> None:
        fa = replica.submit(a)
        await asyncio.sleep(0.2)
        await replica.submit(b)
        await fa

    loop.run_until_complete(run())
    loop.close()
    prefill = H100.step_seconds(StepWork(1000, 1000 * 500, 1000))
    assert a.first_token_s == pytest.approx(prefill)
    assert a.output == 50 and b.output == 10
    assert a.finished_s is not None and b.finished_s is not None
    assert 0.2 < b.first_token_s < b.finished_s  # type: ignore[operator]
    assert replica.kv.free == replica.kv.num_blocks


def test_an_api_server_in_front_delays_a_request_in_and_its_tokens_out() -> None:
    """With the API server modelled, one request's first token comes its intake later and
    one token's streaming after the prefill step; it finishes that streaming after its last
    step; the replica without one is unchanged."""
    cost = FrontEndCost(prompt_token_s=1e-5, token_s=1e-3)
    times: dict[bool, tuple[float | None, float | None, float]] = {}
    for frontend in (None, FrontEnd(cost)):
        loop = VirtualLoop()
        replica = VirtualReplica(loop, H100, SchedulerConfig(), frontend=frontend)
        req = SimRequest("a", 1000, 20)
        loop.run_until_complete(replica.submit(req))
        loop.close()
        times[frontend is None] = (req.first_token_s, req.finished_s, loop.time())
    (first0, end0, _), (first1, end1, resolved) = times[True], times[False]
    assert first0 is not None and end0 is not None and first1 is not None
    assert first1 == pytest.approx(first0 + 1000 * 1e-5 + 1e-3)
    assert end1 == pytest.approx(end0 + 1000 * 1e-5 + 1e-3)
    assert resolved == pytest.approx(end1)


def test_a_request_keeps_one_gap_per_token_after_its_first() -> None:
    """A request alone: its gaps count one per token after the first, each a decode step of
    the model (a run of steps kept as one pair), whatever runs the replica took them in."""
    loop = VirtualLoop()
    replica = VirtualReplica(loop, H100, SchedulerConfig())
    req = SimRequest("a", 100, 30)
    loop.run_until_complete(replica.submit(req))
    loop.close()
    assert sum(n for _, n in req.gaps) == 29
    decode = H100.step_seconds(StepWork(1, 100, 101))
    assert all(g == pytest.approx(decode, rel=0.01) for g, _ in req.gaps)
    assert req.last_token_s == req.finished_s


def test_gap_percentiles_count_each_gap_of_a_run() -> None:
    """Nearest-rank percentiles over (gap, count) pairs equal those over the gaps listed
    one by one; no gaps give 0."""
    gaps = [(0.05, 1), (0.01, 8), (0.2, 1)]
    listed = sorted([0.05] + [0.01] * 8 + [0.2])
    assert gap_percentile(gaps, 0.5) == listed[4] == 0.01
    assert gap_percentile(gaps, 0.9) == listed[8] == 0.05
    assert gap_percentile(gaps, 0.95) == listed[9] == 0.2
    assert gap_percentile([], 0.5) == 0.0
