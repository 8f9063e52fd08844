"""Who held a replica: the requests the sidecar has in flight on it, by lane and tenant.

Each in-flight request (a ``Replica.lease`` given the request's clock) is held by its lane
and tenant: its estimated prompt tokens (request bytes / 4) while it has no first token
(waiting in the engine or prefilling), then one sequence decoding. ``/metrics`` shows them
(``vllm_obs_replica_lane_requests``, ``_prefill_tokens``, ``_decoding``: ``OccupancyCollector``,
classified at scrape time from each request's clock), and each request's event gets the share
of the replica's prompt tokens and of its decoding sequences that other lanes held from its
dispatch to its first token (``pool_others_prompt_share``, ``pool_others_running_share``).

The shares are exact time integrals, kept in O(1) per change: per lane and for the replica,
the running integral of tokens (sequences) over time; a request snapshots its lane's and the
replica's integrals at dispatch and at its first token, and the others' share is the
replica's growth less its own lane's over the replica's. A first token is seen lazily: at the
next dispatch or end on the replica the requests still counted as prefilling whose clock
now has one move to decoding at the time the clock says (in time order), so the relay does
no work for it. No per-token work; a dispatch or an end scans the requests still without a
first token on that replica only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from obs import conventions as c
from obs.events import Event
from obs.phases import Clock


class _Integral:
    """Tokens and sequences held, and their integrals over time (ns)."""

    __slots__ = ("at", "seqs", "seqs_ns", "tokens", "tokens_ns")

    def __init__(self, at: int) -> None:
        self.tokens = self.seqs = 0
        self.tokens_ns = self.seqs_ns = 0
        self.at = at

    def advance(self, t: int) -> None:
        dt = t - self.at
        if dt > 0:
            self.tokens_ns += self.tokens * dt
            self.seqs_ns += self.seqs * dt
            self.at = t

    def read(self, t: int) -> tuple[int, int]:
        dt = t - self.at
        if dt <= 0:
            return self.tokens_ns, self.seqs_ns
        return self.tokens_ns + self.tokens * dt, self.seqs_ns + self.seqs * dt


class Held:
    """One request in flight on the replica."""

    __slots__ = ("at_first", "at_start", "clock", "decoding", "ev", "lane", "tenant", "tokens")

    def __init__(self, lane: str, tenant: str, tokens: int, clock: Clock, ev: Event | None):
        self.lane, self.tenant, self.tokens, self.clock, self.ev = lane, tenant, tokens, clock, ev
        self.decoding = False
        self.at_start: tuple[int, int, int, int] = (0, 0, 0, 0)
        self.at_first: tuple[int, int, int, int] | None = None


class Occupancy:
    """One replica's requests in flight, by lane and tenant (see the module's doc)."""

    def __init__(
        self, tenants: Iterable[str] = (), now: Callable[[], int] = time.perf_counter_ns
    ) -> None:
        self.tenants = frozenset(tenants)
        self.now = now
        self.held: dict[int, Held] = {}
        self._prefilling: dict[int, Held] = {}
        self._lanes: dict[str, _Integral] = {}
        self.seen: set[tuple[str, str]] = set()  # every (lane, tenant) held here: 0 once gone
        self._total = _Integral(now())

    def enter(self, lane: str, tenant: str | None, tokens: int, clock: Clock, ev: Event | None):
        """A request dispatched here: held by its lane until ``leave``."""
        t = self._catch_up()
        bounded = tenant if tenant in self.tenants else c.OTHER_TENANT
        h = Held(lane, bounded, tokens, clock, ev)
        self.seen.add((lane, bounded))
        self._change(lane, t, tokens, 0)
        h.at_start = self._snapshot(lane, t)
        self.held[id(h)] = self._prefilling[id(h)] = h
        return h

    def leave(self, h: Held) -> None:
        """The request ended; its event gets the others' shares."""
        t = self._catch_up()
        if id(h) in self._prefilling:  # no first token: its wait ran to its end
            del self._prefilling[id(h)]
            h.at_first = self._snapshot(h.lane, t)
            self._change(h.lane, t, -h.tokens, 0)
        else:
            self._change(h.lane, t, 0, -1)
        del self.held[id(h)]
        if h.ev is not None and h.at_first is not None:
            h.ev.pool_others_prompt_share, h.ev.pool_others_running_share = _shares(
                h.at_start, h.at_first
            )

    def _catch_up(self) -> int:
        """Move each request whose first token came since the last change to decoding, at the
        time its clock says, in time order; the time now."""
        t = self.now()
        if not self._prefilling:
            return t
        firsts = [h for h in self._prefilling.values() if h.clock.first_up]
        if firsts:
            firsts.sort(key=lambda h: h.clock.first_up)
            for h in firsts:
                at = min(t, max(h.clock.first_up, self._total.at))
                h.at_first = self._snapshot(h.lane, at)
                self._change(h.lane, at, -h.tokens, 1)
                h.decoding = True
                del self._prefilling[id(h)]
        return t

    def _change(self, lane: str, t: int, tokens: int, seqs: int) -> None:
        mine = self._lanes.get(lane)
        if mine is None:
            mine = self._lanes[lane] = _Integral(t)
        for x in (mine, self._total):
            x.advance(t)
            x.tokens += tokens
            x.seqs += seqs

    def _snapshot(self, lane: str, t: int) -> tuple[int, int, int, int]:
        mine = self._lanes.get(lane)
        own = mine.read(t) if mine is not None else (0, 0)
        return (*self._total.read(t), *own)

    def by_lane(self) -> Iterator[tuple[str, str, int, int, int]]:
        """(lane, tenant, requests, prefill tokens, decoding) now, from each request's clock
        (read-only: safe from the scrape thread)."""
        out: dict[tuple[str, str], list[int]] = {k: [0, 0, 0] for k in list(self.seen)}
        for h in list(self.held.values()):
            row = out.setdefault((h.lane, h.tenant), [0, 0, 0])
            row[0] += 1
            if h.clock.first_up:
                row[2] += 1
            else:
                row[1] += h.tokens
        for (lane, tenant), (n, tokens, seqs) in sorted(out.items()):
            yield lane, tenant, n, tokens, seqs


def _shares(
    start: tuple[int, int, int, int], end: tuple[int, int, int, int]
) -> tuple[float | None, float | None]:
    """The others' share of the replica's prompt tokens and decoding sequences between two
    snapshots (None where the replica held none)."""
    tokens = end[0] - start[0]
    seqs = end[1] - start[1]
    return (
        round((tokens - end[2] + start[2]) / tokens, 4) if tokens > 0 else None,
        round((seqs - end[3] + start[3]) / seqs, 4) if seqs > 0 else None,
    )


class OccupancyCollector(Collector):
    """The occupancy gauges of every replica (``replicas`` gives (pool, url, Occupancy))."""

    def __init__(self, replicas: Callable[[], Iterable[tuple[str, str, Occupancy]]]) -> None:
        self.replicas = replicas

    def collect(self) -> Iterator[Any]:
        labels = [c.LANE, c.POOL, c.REPLICA, c.TENANT]
        fams = [GaugeMetricFamily(m.name, m.help, labels=labels) for m in c.OCCUPANCY_METRICS]
        for pool, url, occ in self.replicas():
            for lane, tenant, n, tokens, seqs in occ.by_lane():
                for fam, v in zip(fams, (n, tokens, seqs), strict=True):
                    fam.add_metric([lane, pool, url, tenant], v)
        yield from fams
