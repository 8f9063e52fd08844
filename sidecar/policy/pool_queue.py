"""One queue per saturated pool: which waiting request the pool takes next.

When a pool admits by saturation (``obs.sidecar.policy.saturation``) and has no room, the
requests of all its lanes wait in one queue. The next one is taken from the highest
priority band waiting (the request's priority, 0-9, from its lane's ``priority`` block:
``obs.sidecar.policy.priority``), and within the band by weighted fair share across flows,
a flow being one (lane, tenant): each flow has a virtual time that grows by ``1 / weight``
for each request it is given (weight = the lane's ``saturation.lane_weights`` entry times
the tenant's ``tenants.NAME.weight``, 1 by default), and the flow with the least virtual
time goes next, its oldest request first. A flow that starts waiting joins at the virtual
time of the last request given, so it cannot claim what it did not wait for (start-time
fair queueing). So within a band, backlogged flows are served in proportion to their
weights whatever each offers, and a higher band is always served first: a batch flood in
a lower band never delays an interactive request beyond the requests of its own band and
above. Each request waits at most its lane's ``queue_timeout_s``.

A full queue makes room by priority (``victim``): a newcomer displaces the youngest request
of the lowest band below its own, so a higher band is never refused while a lower one waits;
within its own band, it displaces the youngest request of the flow holding the most when
that flow holds more than the newcomer's, so no flow keeps more than its share of a full
queue. Otherwise the newcomer is the one refused.

The per-lane and per-tenant views (``waiting_by``) are this queue counted by lane or
tenant. Pure ordering: the caller owns the futures and the clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class Waiting:
    """One queued request: its flow, band, weight and when it joined."""

    lane: str
    tenant: str
    band: int
    weight: float
    queued_at: float
    item: object = field(default=None, repr=False)  # the caller's (a future, a ticket)

    @property
    def flow(self) -> tuple[str, str]:
        return (self.lane, self.tenant)


class PoolQueue:
    """The pool's one queue: bands, then start-time fair queueing over (lane, tenant)."""

    def __init__(self) -> None:
        self.flows: dict[int, dict[tuple[str, str], deque[Waiting]]] = {}
        self.vtime: dict[tuple[str, str], float] = {}
        self.now_v = 0.0  # virtual time of the last request given
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def push(self, w: Waiting) -> None:
        band = self.flows.setdefault(w.band, {})
        q = band.get(w.flow)
        if q is None:
            q = band[w.flow] = deque()
            if not any(w.flow in b for b in self.flows.values() if b is not band):
                self.vtime[w.flow] = max(self.vtime.get(w.flow, 0.0), self.now_v)
        q.append(w)
        self.size += 1

    def peek(self) -> Waiting | None:
        """The request to take next, or None when the queue is empty."""
        if not self.size:
            return None
        band = self.flows[max(self.flows)]
        flow = min(band, key=lambda f: (self.vtime.get(f, 0.0), band[f][0].queued_at))
        return band[flow][0]

    def pop(self) -> Waiting | None:
        """Take the next request and charge its flow."""
        w = self.peek()
        if w is None:
            return None
        self._remove(w)
        v = self.vtime.get(w.flow, 0.0)
        self.now_v = max(self.now_v, v)
        self.vtime[w.flow] = v + 1.0 / w.weight
        return w

    def remove(self, w: Waiting) -> bool:
        """Take ``w`` out without serving it (it timed out, or its client left)."""
        band = self.flows.get(w.band, {})
        q = band.get(w.flow)
        if q is None or w not in q:
            return False
        self._remove(w)
        return True

    def _remove(self, w: Waiting) -> None:
        band = self.flows[w.band]
        q = band[w.flow]
        q.remove(w)
        self.size -= 1
        if not q:
            del band[w.flow]
            if not band:
                del self.flows[w.band]
        if not any(w.flow in b for b in self.flows.values()) and len(self.vtime) > 10_000:
            self.vtime.pop(w.flow, None)  # bounded memory; a returning flow rejoins at now_v

    def victim(self, band: int, flow: tuple[str, str]) -> Waiting | None:
        """What a newcomer of ``band`` and ``flow`` displaces from a full queue (see the
        module's doc), or None (the newcomer is refused)."""
        if not self.flows:
            return None
        low = min(self.flows)
        if low > band:
            return None
        flows = self.flows[low]
        big = max(flows, key=lambda f: (len(flows[f]), flows[f][-1].queued_at))
        if low == band:
            mine = flows.get(flow)
            if big == flow or len(flows[big]) <= (len(mine) if mine else 0) + 1:
                return None
        return flows[big][-1]  # its youngest

    def waiting_by(self, what: str) -> dict[str, int]:
        """Requests waiting per ``lane`` or per ``tenant`` (the per-team and per-lane views),
        or per ``band``."""
        out: dict[str, int] = {}
        for band, flows in self.flows.items():
            for (lane, tenant), q in flows.items():
                key = {"lane": lane, "tenant": tenant, "band": str(band)}[what]
                out[key] = out.get(key, 0) + len(q)
        return out
