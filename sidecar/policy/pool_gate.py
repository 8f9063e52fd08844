"""A pool's admission by saturation: admit while the pool has room, else wait in its one
queue (``pool_queue``) for room, at most the lane's ``queue_timeout_s``.

The room comes from ``saturation.room`` over the pool's replicas as the last poll saw them
(``view``: the caller's reading of its pool set), this process's requests in flight now
and at that poll (``polled`` snapshots it). Room is looked for again whenever one of this
process's requests to the pool ends (``release``) and after each poll (``polled``). A
request waits when others are queued ahead of it, so newcomers never overtake the queue.

Refusals (a ``Refusal``, returned: made the outcome by ``obs.sidecar.endings``):
``pool_queue_full`` (the pool's queue holds ``saturation.max_queue``) and
``pool_queue_timeout``. ``Hold.gate`` says which bound held an admitted request
(``saturation.GATES``), None when it went at once.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from obs import conventions as c
from obs.config import Config, Pool
from obs.config_blocks import Saturation
from obs.sidecar.outcomes import ADMISSION, Refusal
from obs.sidecar.policy.pool_queue import PoolQueue, Waiting
from obs.sidecar.policy.saturation import ReplicaView, Room, room

# The pool's replicas as last polled, and the seconds since that poll (None: never).
View = Callable[[], tuple[Sequence[ReplicaView], float | None]]
STALE_POLLS = 3  # a poll older than this many intervals is stale (default stale_after_s)


@dataclass(slots=True)
class Hold:
    """What the gate did with one request: the bound that held it (None: admitted at once)."""

    gate: str | None = None
    waiting: Waiting | None = None


class PoolGate:
    """The admission state of one pool admitted by saturation."""

    def __init__(self, config: Config, pool: Pool, view: View, poll_interval_s: float) -> None:
        assert pool.saturation is not None and pool.declared is not None
        assert pool.declared.max_num_seqs is not None
        self.pool = pool.name
        self.policy: Saturation = pool.saturation
        self.max_num_seqs = pool.declared.max_num_seqs
        self.stale_after_s = self.policy.stale_after_s or STALE_POLLS * poll_interval_s
        self.view = view
        self.lane_weights = self.policy.lane_weights
        self.tenant_weights = {name: t.weight for name, t in config.tenants.items()}
        self.queue = PoolQueue()
        self.in_flight = 0
        self.at_poll = 0
        self._polling = 0
        self.held = False
        self.last: Room | None = None  # the last room read (for /metrics)

    @property
    def queued(self) -> int:
        return len(self.queue)

    def waiting_by_band(self) -> dict[str, int]:
        return self.queue.waiting_by("band")

    def room(self) -> Room:
        replicas, age = self.view()
        r = room(
            replicas, self.policy, self.max_num_seqs, self.in_flight, self.at_poll, age,
            self.stale_after_s, self.held,
        )  # fmt: skip
        self.last = r
        return r

    def weight(self, lane: str, tenant: str | None) -> float:
        return self.lane_weights.get(lane, 1.0) * self.tenant_weights.get(tenant or "", 1.0)

    async def admit(
        self, lane: str, tenant: str | None, band: int, timeout_s: float, hold: Hold
    ) -> bool | Refusal:
        """Wait for room: True once admitted (then ``release`` it), False when the request
        was withdrawn (its client left) while queued, or the ``Refusal``."""
        if not self.queue:
            r = self.room()
            if r.free > 0:
                self.held = False
                self.in_flight += 1
                return True
            hold.gate = r.gate
        else:
            hold.gate = self.last.gate if self.last is not None else None
        self.held = True
        if len(self.queue) >= self.policy.max_queue:
            full = self._make_room(band, (lane, tenant or ""))
            if full is not None:
                return full
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool | Refusal] = loop.create_future()
        w = Waiting(lane, tenant or "", band, self.weight(lane, tenant), loop.time(), fut)
        hold.waiting = w
        self.queue.push(w)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            if _admitted(fut):
                return True
            self.queue.remove(w)
            why = f"pool {self.pool!r} had no room within {timeout_s:g} s"
            retry = max(1, math.ceil(timeout_s / 2))
            return Refusal(429, why, c.POOL_QUEUE_TIMEOUT, ADMISSION, retry)
        except BaseException:
            if _admitted(fut):
                self.release()
            else:
                self.queue.remove(w)
            raise

    def _make_room(self, band: int, flow: tuple[str, str]) -> Refusal | None:
        """The queue is full: displace what a newcomer of ``band`` and ``flow`` outranks
        (``PoolQueue.victim``: that request is refused ``pool_queue_full``), or refuse it."""
        n = self.policy.max_queue
        full = f"pool {self.pool!r} is saturated and its queue is full ({n} waiting)"
        w = self.queue.victim(band, flow)
        if w is None:
            return Refusal(429, full, c.POOL_QUEUE_FULL, ADMISSION, 1)
        self.queue.remove(w)
        fut = w.item
        assert isinstance(fut, asyncio.Future)
        if not fut.done():
            why = f"{full}; a request of higher priority or a smaller flow took this one's place"
            fut.set_result(Refusal(429, why, c.POOL_QUEUE_FULL, ADMISSION, 1))
        return None

    def withdraw(self, hold: Hold) -> None:
        """The client left while queued: stop waiting (``admit`` returns False)."""
        w = hold.waiting
        if w is not None and self.queue.remove(w):
            fut = w.item
            assert isinstance(fut, asyncio.Future)
            if not fut.done():
                fut.set_result(False)

    def release(self) -> None:
        """One of this process's admitted requests to the pool ended."""
        self.in_flight -= 1
        self.wake()

    def on_poll(self, done: bool) -> None:
        """A poll of the pool's replicas starts (False) or ends (True): what it reads counts
        this process's requests in flight when it started."""
        if not done:
            self._polling = self.in_flight
            return
        self.at_poll = min(self._polling, self.in_flight)
        self.wake()

    def polled(self) -> None:
        """A poll that read the pool at once (tests, the sweep's replay)."""
        self.on_poll(False)
        self.on_poll(True)

    def wake(self) -> None:
        """Admit queued requests while the pool has room."""
        while self.queue:
            r = self.room()
            if r.free <= 0:
                return
            w = self.queue.pop()
            assert w is not None
            fut = w.item
            assert isinstance(fut, asyncio.Future)
            if fut.done():
                continue
            self.in_flight += 1
            fut.set_result(True)
        self.held = False


def _admitted(fut: asyncio.Future[bool | Refusal]) -> bool:
    """The queued request was given room (not withdrawn, displaced or cancelled)."""
    return fut.done() and not fut.cancelled() and fut.exception() is None and fut.result() is True
