"""The plan's two searches, pure: the fewest replicas that pass, and a lane's limits.

:func:`fewest` assumes a pool that passes with N replicas passes with more (attainment is
monotone in replicas, which the replay's curve shows): it doubles until one passes, then
bisects, so it replays O(log N) sizes, and remembers every answer.

:func:`little_limits` sizes a lane's admission by Little's law: at the lane's peak arrival
rate ``rate`` (requests/s) and mean time in the pool ``service_s``, ``L = rate x service_s``
requests are in flight on average. While the pool keeps up, the lane is an infinite-server
queue for its requests, whose number in flight is Poisson with mean L, so a limit of
``L + z sqrt(L)`` refuses only in the top tail (z = 3: about 1 interval in 700). The queue
holds one mean service time of arrivals beyond that, the burst a slot takes to absorb.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

Z = 3.0  # standard deviations of Poisson concurrency the limit leaves room for


@dataclass(slots=True)
class Search:
    """The fewest ``n`` in [1, ``most``] with ``passes(n)``; every answer kept in ``tried``."""

    passes: Callable[[int], bool]
    most: int = 4096
    tried: dict[int, bool] = field(default_factory=dict)

    def ask(self, n: int) -> bool:
        if n not in self.tried:
            self.tried[n] = self.passes(n)
        return self.tried[n]

    def fewest(self, start: int = 1) -> int | None:
        """Double from ``start`` until a size passes, then bisect; None if ``most`` fails."""
        lo, n = 0, max(1, start)
        while not self.ask(n):
            lo = n
            if n >= self.most:
                return None
            n = min(self.most, n * 2)
        hi = n  # passes; lo fails (or is 0)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.ask(mid):
                hi = mid
            else:
                lo = mid
        return hi


def fewest(passes: Callable[[int], bool], start: int = 1, most: int = 4096) -> int | None:
    """The fewest replicas with which ``passes`` holds (see :class:`Search`)."""
    return Search(passes, most).fewest(start)


@dataclass(frozen=True, slots=True)
class Limits:
    max_concurrency: int
    max_queue: int
    in_flight: float  # L, Little's law's mean number in flight at the peak rate


def little_limits(rate: float, service_s: float, z: float = Z) -> Limits:
    """Admission limits for a lane seeing ``rate`` requests/s at its peak, each spending
    ``service_s`` on average in the pool (see the module docstring)."""
    if rate < 0 or service_s < 0:
        raise ValueError("rate and service time must not be negative")
    load = rate * service_s
    concurrency = max(1, math.ceil(load + z * math.sqrt(load)))
    queue = max(1, math.ceil(load))
    return Limits(concurrency, queue, round(load, 3))


def widen(limits: Limits, factor: float = 1.5) -> Limits:
    """Larger limits for a lane the check found refusing at the plan."""
    return Limits(
        max(limits.max_concurrency + 1, math.ceil(limits.max_concurrency * factor)),
        max(limits.max_queue + 1, math.ceil(limits.max_queue * factor)),
        limits.in_flight,
    )
