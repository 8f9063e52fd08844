"""Admission by a pool's own measured state: how many more requests this process may send.

Every sidecar process (any number of workers and replicas in front of the same pool) polls
each replica's ``/metrics`` (``obs.sidecar.pools.pools``) and knows exactly what it has itself in
flight. From the last poll of each healthy replica (requests waiting, requests running
against the pool's declared ``max_num_seqs``, KV cache usage) and what this process sent or
finished since that poll, it estimates the pool's waiting queue now:

    free  = sum over replicas of (max_num_seqs - running), 0 for a replica that has
            requests waiting or whose KV cache is at saturation.kv_cache_usage_max
    delta = this process's requests in flight now - at the poll
    waiting_now = max(0, waiting + delta - free)

and admits a request while ``waiting_now`` stays under ``max_waiting`` per healthy replica
(its room: ``free + target - waiting - delta``), but grows its own in-flight count past its
count at the poll by at most half the room the poll showed (rounded up): its own
completions it refills at once, and two senders that saw the same room at one poll fill it
between them instead of twice.
(the target; default 2, ``obs.config_blocks.DEFAULT_MAX_WAITING``). Others' requests are
seen at the next poll; this process's own completions free room at once, and it refills
them, so in a steady flood each sender keeps its share and the pool's queue holds near the
target without the senders talking to each other. Only a change of load (all senders seeing
the same room at one poll) overshoots: by nothing with two senders, by half the room per
sender beyond two.

Hysteresis: once a request had to wait (the pool is *held*), the pool admits again only
when the estimate is ``hysteresis`` (default 1) under the target, so it does not flap at
the boundary on every completion.

Stale polls: when the pool's last poll is older than ``stale_after_s`` (default three poll
intervals), this process admits on its own counts alone, as if it were the pool's only
sender: up to ``max_num_seqs + max_waiting`` per healthy replica in flight.

``gate`` says which bound held a request: ``waiting`` (the estimate), ``kv_cache`` (a
replica at its KV limit left no free slot), ``stale`` (own counts), ``no_replica`` (no
healthy replica). Pure: the caller passes the replicas' views, its counts and the time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from obs.config_blocks import Saturation

WAITING = "waiting"
KV_CACHE = "kv_cache"
STALE = "stale"
NO_REPLICA = "no_replica"
GATES = (WAITING, KV_CACHE, STALE, NO_REPLICA)


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """One replica as its last poll saw it (``None``: the engine does not report it)."""

    healthy: bool
    waiting: float | None
    running: float | None
    kv_cache_usage: float | None


@dataclass(frozen=True, slots=True)
class Room:
    """How many more requests this process may send now (<= 0: none), the estimate of the
    pool's waiting queue it read, and the bound that holds when there is no room."""

    free: int
    waiting: float
    gate: str


def room(
    replicas: Sequence[ReplicaView],
    policy: Saturation,
    max_num_seqs: int,
    in_flight_now: int,
    in_flight_at_poll: int,
    poll_age_s: float | None,
    stale_after_s: float,
    held: bool = False,
) -> Room:
    """The room the pool has for this process's next request (see the module docstring)."""
    healthy = [r for r in replicas if r.healthy]
    if not healthy:
        return Room(0, 0.0, NO_REPLICA)
    target = len(healthy) * policy.max_waiting - (policy.hysteresis if held else 0)
    if poll_age_s is None or poll_age_s > stale_after_s:
        slots = len(healthy) * max_num_seqs
        waiting = max(0.0, float(in_flight_now - slots))
        return Room(target + slots - in_flight_now, waiting, STALE)
    waiting_total = 0.0
    free = 0.0
    kv_bound = False
    limit = policy.kv_cache_usage_max
    for r in healthy:
        w = r.waiting or 0.0
        waiting_total += w
        if limit is not None and r.kv_cache_usage is not None and r.kv_cache_usage >= limit:
            kv_bound = True
            continue
        if w <= 0:
            free += max(0.0, max_num_seqs - (r.running or 0.0))
    delta = in_flight_now - in_flight_at_poll
    waiting = max(0.0, waiting_total + delta - free)
    gate = KV_CACHE if kv_bound and free == 0 else WAITING
    at_poll = math.floor(target + free - waiting_total)  # the room the poll showed
    growth = math.ceil(max(0, at_poll) / 2)  # this process's part of it until the next poll
    return Room(min(at_poll, growth) - delta, waiting, gate)
