"""The lane SLOs as the rule and dashboard generators read them: one model for both.

``objectives(lane)`` lists a lane's declared SLOs in ``RULE_SLO_KINDS`` order;
``obs.alerts.model.SLI`` adds the burn windows that alert on one of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from obs import conventions as c
from obs.config import Lane, LatencySLO

# The histogram each latency SLO kind is judged on.
LATENCY_HISTOGRAMS = {"ttft": c.TTFT, "tpot": c.TPOT, "itl": c.ITL_REQUEST_P95}


@dataclass(frozen=True, slots=True)
class Objective:
    """One declared SLO of one lane."""

    lane: str
    pool: str
    kind: str  # one of conventions.RULE_SLO_KINDS
    objective: float
    threshold_ms: float | None  # latency SLOs only

    @property
    def budget(self) -> float:
        """The error budget: the share of requests allowed to break the SLO."""
        return round(1 - self.objective, 12)

    @property
    def threshold_s(self) -> float | None:
        """The latency threshold in seconds, rounded as the histogram buckets are."""
        return None if self.threshold_ms is None else round(self.threshold_ms / 1000, 6)

    @property
    def le(self) -> str:
        """The ``le`` label of the histogram bucket that ends exactly at the threshold."""
        if self.threshold_s is None:
            raise ValueError(f"{self.kind} SLO of lane {self.lane} has no latency threshold")
        return c.bucket_le(self.threshold_s)

    @property
    def title(self) -> str:
        """E.g. ``TTFT <= 500 ms for 95%`` or ``availability 99.5%``."""
        share = f"{self.objective * 100:g}%"
        if self.threshold_ms is None:
            return f"{self.kind} {share}"
        return f"{self.kind.upper()} <= {self.threshold_ms:g} ms for {share}"


def objectives(lane: Lane) -> list[Objective]:
    """The lane's declared SLOs, in ``RULE_SLO_KINDS`` order."""
    out = []
    for kind in c.RULE_SLO_KINDS:
        slo = getattr(lane.slo, kind)
        if slo is None:
            continue
        threshold = slo.threshold_ms if isinstance(slo, LatencySLO) else None
        out.append(Objective(lane.name, lane.pool, kind, slo.objective, threshold))
    return out
