"""One pool's lanes on N simulated replicas, in virtual time: the plan's adapter over the
sweep's replay parts.

Grown arrivals (obs.plan.resample) go the way the sidecar takes them, with its own code:
admitted by ``obs.sidecar.policy.admission.LaneGate`` under the candidate limits, routed by
``obs.sidecar.pools.pools.PoolSet`` (least outstanding, or prefix affinity on the recorded
prefix fingerprint), served by ``obs.sweep.virtual.VirtualReplica`` (the simulated
engine's scheduler and performance model) on a ``VirtualLoop`` whose clock jumps. The
lane's first-token timeout aborts a request as the relay does. Each request becomes an
:class:`~obs.plan.judge.Outcome`; nothing is written. What is not replayed: HTTP, the
slow reader's own pace (a recorded ``stream_ms``), multi-turn think times (each recorded
turn is an arrival of its own).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from hashlib import blake2b

from obs.config import Config, Lane
from obs.engines.sim.hardware import PerfModel
from obs.engines.sim.scheduler import SchedulerConfig, SimRequest
from obs.plan.judge import Outcome
from obs.plan.resample import Arrival
from obs.plan.search import Limits
from obs.sidecar.outcomes import Refusal
from obs.sidecar.policy.admission import LaneGate, Ticket, cost_of
from obs.sidecar.pools.pools import PoolSet
from obs.sweep.virtual import VirtualLoop, VirtualReplica

BLOCK_SIZE = 16
PROGRESS_EVERY = 5000  # requests between progress calls


@dataclass(frozen=True, slots=True)
class PoolModel:
    """What one simulated replica of a pool is: GPU and model, scheduler flags, KV size."""

    name: str
    gpu: str
    model: str
    perf: PerfModel
    scheduler: SchedulerConfig
    kv_blocks: int | None = None


@dataclass(slots=True)
class ReplayRun:
    """A replay's outcomes per lane, and the most requests each lane had in the pool."""

    replicas: int
    outcomes: dict[str, list[Outcome]]
    peak_in_flight: dict[str, int] = field(default_factory=dict)
    virtual_s: float = 0.0


def lane_with(lane: Lane, limits: Limits | None) -> Lane:
    """``lane`` with its capacity limits replaced: ``limits``, or none at all (None). A
    token budget is dropped either way: the plan sizes lanes by requests."""
    update: dict[str, object] = {"token_budget": None, "max_concurrency": None, "max_queue": 0}
    if limits is not None:
        update |= {"max_concurrency": limits.max_concurrency, "max_queue": limits.max_queue}
    return lane.model_copy(update={"admission": lane.admission.model_copy(update=update)})


def _prefix_hashes(prefix: str | None, tokens: int) -> list[int]:
    if prefix is None or tokens < BLOCK_SIZE:
        return []
    base = int.from_bytes(blake2b(prefix.encode(), digest_size=8).digest(), "big")
    return [hash((base, i)) for i in range(tokens // BLOCK_SIZE)]


class PoolReplay:
    """One replay of one pool's lanes at ``replicas`` replicas."""

    def __init__(
        self,
        config: Config,
        pool: PoolModel,
        lanes: list[Lane],
        replicas: int,
        limits: dict[str, Limits | None],
    ) -> None:
        self.loop = VirtualLoop()
        urls = [f"http://sim-{pool.name}-{i}" for i in range(replicas)]
        self.engines = {
            url: VirtualReplica(self.loop, pool.perf, pool.scheduler, BLOCK_SIZE, pool.kv_blocks)
            for url in urls
        }
        pools = [
            p.model_copy(update={"replicas": urls}) for p in config.pools if p.name == pool.name
        ]
        self.pools = PoolSet(config.model_copy(update={"pools": pools}))
        self.pool = pool.name
        self.lanes = {lane.name: lane_with(lane, limits.get(lane.name)) for lane in lanes}
        self.gates = {name: LaneGate(lane) for name, lane in self.lanes.items()}
        self.run_ = ReplayRun(replicas, {name: [] for name in self.lanes})
        self.failures: list[BaseException] = []

    def run(
        self, arrivals: list[Arrival], progress: Callable[[int, int], None] | None = None
    ) -> ReplayRun:
        try:
            self.loop.run_until_complete(self._feed(arrivals, progress))
        finally:
            self.loop.close()
        if self.failures:
            raise RuntimeError(f"the replay lost {len(self.failures)} request(s)") from (
                self.failures[0]
            )
        self.run_.virtual_s = self.loop.now
        return self.run_

    async def _feed(
        self, arrivals: list[Arrival], progress: Callable[[int, int], None] | None
    ) -> None:
        tasks: set[asyncio.Task[None]] = set()

        def done(task: asyncio.Task[None]) -> None:
            tasks.discard(task)
            exc = None if task.cancelled() else task.exception()
            if exc is not None:
                self.failures.append(exc)

        for i, a in enumerate(arrivals):
            delay = a.t - self.loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            task = self.loop.create_task(self._one(a))
            tasks.add(task)
            task.add_done_callback(done)
            if progress is not None and i % PROGRESS_EVERY == 0:
                progress(i, len(arrivals))
        while tasks:
            await asyncio.gather(*list(tasks))
        if progress is not None:
            progress(len(arrivals), len(arrivals))

    async def _one(self, a: Arrival) -> None:
        received = self.loop.time()
        lane = self.lanes[a.lane]
        gate = self.gates[a.lane]
        out = self.run_.outcomes[a.lane]
        s = a.shape
        ticket = Ticket("default", cost_of(s.prompt_tokens, s.max_tokens))
        admitted = gate.check(s.prompt_tokens, s.max_tokens) or await gate.admit(ticket)
        if isinstance(admitted, Refusal):
            out.append(Outcome(ok=False, rejected=True))
            return
        peak = self.run_.peak_in_flight
        peak[a.lane] = max(peak.get(a.lane, 0), gate.in_flight)
        try:
            out.append(await self._serve(a, lane, received))
        finally:
            gate.release(ticket)

    async def _serve(self, a: Arrival, lane: Lane, received: float) -> Outcome:
        s = a.shape
        admitted = self.loop.time()
        affinity = s.prefix if lane.routing == "prefix_affinity" else None
        replica = self.pools.candidates(self.pool, affinity)[0]
        engine = self.engines[replica.url]
        req = SimRequest(
            f"r{a.index}",
            max(1, s.prompt_tokens),
            max(1, s.output_tokens),
            _prefix_hashes(s.prefix, s.cached_tokens),
        )
        with replica.lease():
            fut = engine.submit(req)
            timer = self.loop.call_at(
                admitted + lane.timeouts.first_token_s, _first_token_due, engine, req, fut
            )
            try:
                await fut
            except (RuntimeError, TimeoutError):
                return Outcome(ok=False, service_s=self.loop.time() - admitted)
            finally:
                timer.cancel()
        first, end = req.first_token_s, req.finished_s
        assert first is not None and end is not None
        if s.stream:
            ttft = first - received
            tpot = (end - first) / (req.output - 1) if req.output > 1 else None
        else:
            ttft, tpot = end - received, None
        return Outcome(
            ok=True,
            ttft_s=ttft,
            tpot_s=tpot,
            service_s=end - admitted,
            tokens=req.prompt_tokens + req.output,
        )


def _first_token_due(
    engine: VirtualReplica, req: SimRequest, fut: asyncio.Future[SimRequest]
) -> None:
    if req.first_token_s is None and not fut.done():
        engine.abort(req)
        fut.set_exception(TimeoutError())
