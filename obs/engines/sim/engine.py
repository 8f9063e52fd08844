"""The simulated engine in real time: the scheduler's steps, each as long as the model says.

One asyncio task runs steps back to back while there is work: schedule a batch, sleep
the step's modelled time, complete it, and wake each request whose output grew. A
request is a :class:`Ticket`: its scheduler request plus an event the HTTP handler
waits on. Steps never block the event loop, so ``/metrics`` and new requests are
served between them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from obs.engines.sim.hardware import PerfModel
from obs.engines.sim.kvcache import KvCache
from obs.engines.sim.metrics import SimMetrics
from obs.engines.sim.scheduler import Scheduler, SchedulerConfig, SimRequest


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The replica's settings: the scheduler's flags, the cache and the step clock."""

    scheduler: SchedulerConfig
    model_name: str
    max_model_len: int
    block_size: int = 16
    num_blocks: int | None = None  # None: as many as the GPU holds (the perf model)
    prefix_caching: bool = True
    stream_interval: int = 1
    speed: float = 1.0  # modelled seconds per real second (>1 runs faster than the GPU)


@dataclass(slots=True, eq=False)
class Ticket:
    req: SimRequest
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    failed: str | None = None


class SimEngine:
    def __init__(self, config: EngineConfig, perf: PerfModel) -> None:
        self.config = config
        self.perf = perf
        blocks = config.num_blocks or perf.kv_blocks(config.block_size)
        self.kv = KvCache(blocks, config.block_size, config.prefix_caching)
        self.scheduler = Scheduler(config.scheduler, self.kv)
        self.metrics = SimMetrics(
            self.scheduler, config.model_name, self.cache_info(), config.max_model_len
        )
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._t0 = time.monotonic()

    def cache_info(self) -> dict[str, str]:
        cfg = self.config
        blocks = self.kv.num_blocks
        return {
            "block_size": str(cfg.block_size),
            "cache_dtype": self.perf.kv_dtype,
            "enable_prefix_caching": str(cfg.prefix_caching),
            "gpu_memory_utilization": str(self.perf.cal.memory_utilization),
            "kv_cache_size_tokens": str(blocks * cfg.block_size),
            "num_gpu_blocks": str(blocks),
        }

    def now(self) -> float:
        """Modelled seconds since the engine started."""
        return (time.monotonic() - self._t0) * self.config.speed

    @property
    def capacity_tokens(self) -> int:
        return self.kv.num_blocks * self.kv.block_size

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def submit(self, req: SimRequest, changed: asyncio.Event | None = None) -> Ticket:
        """Queue ``req``; its ticket's ``changed`` (shared by the choices of one HTTP
        request) is set whenever its output grows, it finishes or it fails."""
        req.arrival_s = self.now()
        ticket = Ticket(req, changed or asyncio.Event())
        req.owner = ticket
        self.scheduler.add(req)
        self._wake.set()
        return ticket

    def abort(self, ticket: Ticket) -> None:
        """Drop a request its client left (nothing to do once it finished); a request
        that had not failed is observed as aborted."""
        if ticket.req.finished_s is None:
            self.scheduler.abort(ticket.req)
            if ticket.failed is None:
                self.metrics.aborted(ticket.req)

    async def _run(self) -> None:
        s = self.scheduler
        while True:
            if not s.busy:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = s.schedule(self.now())
            if not batch.items:
                self._refuse_stuck()
                await asyncio.sleep(0)
                continue
            self.metrics.iteration_tokens.observe(batch.work.tokens)
            await asyncio.sleep(self.perf.step_seconds(batch.work) / self.config.speed)
            now = self.now()
            emitted, finished = s.complete(batch, now)
            for req in emitted:
                ticket = req.owner
                assert isinstance(ticket, Ticket)
                if req.output == 1 or req.last_token_s is None:
                    self.metrics.first_token(req)
                else:
                    self.metrics.itl.observe(now - req.last_token_s)
                req.last_token_s = now
                ticket.changed.set()
            for req in finished:
                self.metrics.finished(req)

    def _refuse_stuck(self) -> None:
        """Nothing runs and the first waiting request cannot get its blocks: it never will."""
        s = self.scheduler
        if s.running or not s.waiting:
            return
        req = s.waiting.popleft()
        ticket = req.owner
        assert isinstance(ticket, Ticket)
        ticket.failed = (
            f"the request needs more KV cache than this replica has ({self.capacity_tokens} tokens)"
        )
        ticket.changed.set()
