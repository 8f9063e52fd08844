"""The recorded traffic a plan starts from: per lane, arrivals per interval and request shapes.

Pure data (the reading is :mod:`obs.plan.source`). A lane's traffic is how many requests
arrived in each ``bin_s`` interval of the window (every offered request: served, failed or
refused; client errors excluded) and a sample of the shapes of its served requests
(prompt, output, cached prefix, streamed), which the replay draws from. Memory is bounded
by the number of intervals and the sample size, not by the number of events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True, slots=True)
class Shape:
    """One served request's shape, as the replay re-sends it."""

    prompt_tokens: int
    output_tokens: int
    max_tokens: int | None
    stream: bool
    cached_tokens: int = 0
    prefix: str | None = None  # the prefix fingerprint (shared prefix, affinity key)


@dataclass(slots=True)
class LaneTraffic:
    """One lane's recorded traffic."""

    lane: str
    pool: str
    counts: list[int]  # offered requests per interval of the window
    shapes: list[Shape] = field(default_factory=list)
    served: int = 0  # served requests in the window (the sample is drawn from them)

    @property
    def offered(self) -> int:
        return sum(self.counts)


@dataclass(slots=True)
class Traffic:
    """Every lane's recorded traffic over one window, in ``bin_s`` intervals."""

    bin_s: float
    span_s: float
    lanes: dict[str, LaneTraffic]
    events: int = 0  # events read in the window
    sampled: bool = False  # some lane's shapes are a sample of its served requests
    start: datetime | None = None  # the first interval's start (UTC)
    notes: tuple[str, ...] = ()  # what the scan skipped (malformed or out-of-range lines)

    def pools(self) -> dict[str, list[str]]:
        """Pool -> its lanes (in the order first seen)."""
        out: dict[str, list[str]] = {}
        for lt in self.lanes.values():
            out.setdefault(lt.pool, []).append(lt.lane)
        return out

    def tokens(self, lanes: list[str] | None = None) -> float:
        """Prompt plus output tokens the window's offered requests stand for (the sample's
        mean shape times the offered count)."""
        total = 0.0
        for lt in self.lanes.values():
            if (lanes is not None and lt.lane not in lanes) or not lt.shapes:
                continue
            mean = sum(s.prompt_tokens + s.output_tokens for s in lt.shapes) / len(lt.shapes)
            total += mean * lt.offered
        return total
