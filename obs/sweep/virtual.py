"""Virtual time for the stress replay: an asyncio loop whose clock jumps, and simulated replicas.

:class:`VirtualLoop` is an ordinary asyncio event loop whose ``time()`` is a number it
advances itself: when nothing is ready, the wait for the next timer takes no real
time, the clock jumps to that timer. Code that runs on it (the sidecar's admission
gates, their ``asyncio.wait_for`` queue timeouts) runs unchanged, in virtual seconds.

:class:`VirtualReplica` drives one simulated engine (obs.engines.sim's scheduler and
performance model) on that clock with timers: a step ends ``step_seconds`` after it
began; runs of identical decode-only steps are taken in one timer and cut short
when a request arrives (it joins at the next step boundary, as in the real engine).
Each request keeps its inter-token gaps as the engine samples its tokens, a run's steps
as one pair (its step time, how many). Given a :class:`~obs.engines.sim.frontend.FrontEnd`
(the API server's CPU), a request reaches the scheduler when the front end has taken it
in, and its first token and its end reach the caller when the front end has streamed
them; without one (the stress replay's default) both are immediate.
"""

from __future__ import annotations

import asyncio
import math
import selectors
from typing import Any

from obs.engines.sim.frontend import FrontEnd
from obs.engines.sim.hardware import PerfModel
from obs.engines.sim.kvcache import KvCache
from obs.engines.sim.scheduler import Batch, Scheduler, SchedulerConfig, SimRequest

MAX_RUN_STEPS = 4096


class _JumpSelector(selectors.DefaultSelector):
    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualLoop | None = None

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if ready:
            return ready
        if timeout is None:
            raise RuntimeError("virtual loop: nothing scheduled and nothing ready (deadlock)")
        assert self.loop is not None
        self.loop.now += timeout
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        selector = _JumpSelector()
        super().__init__(selector)
        selector.loop = self
        self.now = 0.0

    def time(self) -> float:
        return self.now


class VirtualReplica:
    """One simulated replica on a :class:`VirtualLoop`."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        perf: PerfModel,
        config: SchedulerConfig,
        block_size: int = 16,
        num_blocks: int | None = None,
        frontend: FrontEnd | None = None,
        prefix_caching: bool = True,
    ) -> None:
        self.loop = loop
        self.frontend = frontend
        self._intake: set[SimRequest] = set()  # with the front end, not yet scheduled
        self.perf = perf
        self.kv = KvCache(num_blocks or perf.kv_blocks(block_size), block_size, prefix_caching)
        self.scheduler = Scheduler(config, self.kv)
        self._batch: Batch | None = None
        self._steps = 0
        self._start = 0.0
        self._dt = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._lockstep = False  # the running run is a multi-step schedule (tokens at its end)
        self.steps = 0

    def submit(self, req: SimRequest) -> asyncio.Future[SimRequest]:
        """Queue ``req``; the future is done when it finishes (or fails: ``owner`` says)."""
        fut: asyncio.Future[SimRequest] = self.loop.create_future()
        req.owner = fut
        req.arrival_s = now = self.loop.time()
        if self.frontend is None:
            self._enter(req)
        else:
            self._intake.add(req)
            self.loop.call_at(self.frontend.intake(now, req.prompt_tokens), self._enter, req)
        return fut

    def _enter(self, req: SimRequest) -> None:
        if self.frontend is not None:
            if req not in self._intake:
                return  # aborted while the front end took it in
            self._intake.discard(req)
        self.scheduler.add(req)
        if self._batch is None:
            self._next()
        elif self._steps > 1 and not self._lockstep:
            self._cut()

    def abort(self, req: SimRequest) -> None:
        """Drop a request still in the engine (the sidecar gave up on it)."""
        if req in self._intake:
            self._intake.discard(req)
            return
        if req.finished_s is None:
            if self._batch is not None and any(r is req for r, _ in self._batch.items):
                self._cut_to_one_step()
                req.max_tokens = min(req.max_tokens, req.output + 1)  # ends at the boundary
                return
            self.scheduler.abort(req)

    def _cut(self) -> None:
        """A request arrived during a run: end the run at the next step boundary."""
        done = math.floor((self.loop.time() - self._start) / self._dt) + 1
        if done < self._steps:
            self._reschedule(done)

    def _cut_to_one_step(self) -> None:
        if self._steps > 1:
            self._cut()

    def _reschedule(self, steps: int) -> None:
        assert self._handle is not None
        self._handle.cancel()
        self._steps = steps
        self._handle = self.loop.call_at(self._start + steps * self._dt, self._end)

    def _next(self) -> None:
        s = self.scheduler
        while s.busy:
            now = self.loop.time()
            batch = s.schedule(now)
            if not batch.items:
                self._refuse_stuck()
                continue
            self._lockstep = s.lockstep(batch) > 1
            if self._lockstep:  # multi-step scheduling: one schedule, N steps, no cut
                steps = s.lockstep(batch)
                work = s.run_work(batch, steps)
                self._dt = self.perf.lockstep_seconds(work, steps) / steps
            else:
                steps = s.decode_run(batch, MAX_RUN_STEPS)
                self._dt = self.perf.step_seconds(s.run_work(batch, steps))
            self._batch, self._steps, self._start = batch, steps, now
            self._handle = self.loop.call_at(now + steps * self._dt, self._end)
            return
        self._batch = None

    def _end(self) -> None:
        batch, steps = self._batch, self._steps
        assert batch is not None
        self.steps += steps
        now = self.loop.time()
        emitted, finished = self.scheduler.complete_run(batch, steps, now)
        self._keep_gaps(emitted, steps, now)
        if self.frontend is not None:
            if self._lockstep:  # every token of the run is handed over at its end
                out = self.frontend.stream(now - self._dt, self._dt, 1, steps * len(emitted))
            else:
                out = self.frontend.stream(self._start, self._dt, steps, len(emitted))
            for req in emitted:
                if req.first_token_s == now:
                    req.first_token_s = out
            for req in finished:
                req.finished_s = out
        for req in finished:
            fut = req.owner
            if isinstance(fut, asyncio.Future) and not fut.done():
                if req.finished_s == now:
                    fut.set_result(req)
                else:
                    self.loop.call_at(req.finished_s or now, _resolve, fut, req)
        self._next()

    def _keep_gaps(self, emitted: list[SimRequest], steps: int, now: float) -> None:
        """Each request's gaps since its last token: the first step of the run ended
        ``step_s`` after it began; every step after it is one more gap of ``step_s``."""
        first_end = self._start + self._dt
        for req in emitted:
            last = req.last_token_s
            req.last_token_s = now
            if last is None:
                continue  # its first token
            if self._lockstep:  # the run's tokens arrive together at its end
                req.gaps.append((now - last, 1))
                req.gaps.append((0.0, steps - 1))
                continue
            req.gaps.append((first_end - last, 1))
            if steps > 1:
                req.gaps.append((self._dt, steps - 1))

    def _refuse_stuck(self) -> None:
        s = self.scheduler
        if s.running or not s.waiting:
            return
        req = s.waiting.popleft()
        fut = req.owner
        if isinstance(fut, asyncio.Future) and not fut.done():
            fut.set_exception(RuntimeError("the request needs more KV cache than the replica has"))


def gap_percentile(gaps: list[tuple[float, int]], q: float) -> float:
    """Nearest-rank percentile (as obs.phases.percentile) of gaps kept as (seconds, how
    many) pairs; 0 for none."""
    ordered = sorted(gaps)
    n = sum(count for _, count in ordered)
    rank = max(0, min(n - 1, int(q * n + 0.999999) - 1))
    for gap, count in ordered:
        if rank < count:
            return gap
        rank -= count
    return 0.0


def _resolve(fut: asyncio.Future[SimRequest], req: SimRequest) -> None:
    if not fut.done():
        fut.set_result(req)
