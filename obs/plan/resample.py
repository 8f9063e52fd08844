"""Arrivals at ``--growth``: drawn again from the recorded rate, not compressed. Pure.

Each lane's arrivals are a Poisson process whose rate in each interval is the recorded
count of that interval over its length, times ``growth``: the recording's daily shape
(its peaks and lulls) stays, the requests are new draws, so a grown peak is not the
recorded peak repeated eight times at the same instants. Each arrival's shape is drawn
(with replacement) from the lane's recorded shapes. Same seed, same arrivals.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from obs.plan.traffic import LaneTraffic, Shape


@dataclass(frozen=True, slots=True)
class Arrival:
    t: float  # seconds from the window's start
    lane: str
    shape: Shape
    index: int


def poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw of ``mean`` (Knuth's product for small means, a normal approximation
    rounded and floored at 0 above 30)."""
    if mean <= 0:
        return 0
    if mean > 30:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def lane_arrivals(
    lt: LaneTraffic, bin_s: float, growth: float, rng: random.Random
) -> list[tuple[float, Shape]]:
    """One lane's grown arrivals, by time: per interval a Poisson number (mean: recorded
    count x growth), each at a uniform instant of the interval, each with a drawn shape."""
    if not lt.shapes:
        return []
    out = []
    for i, count in enumerate(lt.counts):
        for _ in range(poisson(rng, count * growth)):
            out.append(((i + rng.random()) * bin_s, rng.choice(lt.shapes)))
    out.sort(key=lambda a: a[0])
    return out


def arrivals(lanes: list[LaneTraffic], bin_s: float, growth: float, seed: int) -> list[Arrival]:
    """Every lane's grown arrivals merged by time; each lane draws from its own stream, so
    adding a lane does not move another's arrivals."""
    merged: list[tuple[float, str, Shape]] = []
    for lt in lanes:
        rng = random.Random(f"{seed}:{lt.lane}")
        merged.extend((t, lt.lane, s) for t, s in lane_arrivals(lt, bin_s, growth, rng))
    merged.sort(key=lambda a: (a[0], a[1]))
    return [Arrival(t, lane, shape, i) for i, (t, lane, shape) in enumerate(merged)]


def busiest(totals: list[float], cap: float) -> tuple[int, int]:
    """The busiest run of whole intervals whose expected arrivals (``totals``, per
    interval) stay near ``cap``: ``(first, end)``, end exclusive; every interval when the
    whole window fits. At least one interval."""
    n = len(totals)
    whole = sum(totals)
    if whole <= cap or n <= 1:
        return 0, n
    k = max(1, min(n, int(cap / (whole / n))))
    window = sum(totals[:k])
    best, first = window, 0
    for i in range(k, n):
        window += totals[i] - totals[i - k]
        if window > best:
            best, first = window, i - k + 1
    return first, first + k
