"""What the dashboards read from each lane's SLOs: names, thresholds, windows, goodput."""

from __future__ import annotations

from dataclasses import dataclass

from obs import conventions as c
from obs.config import SLO, Config, Lane, LatencySLO

from . import expr as e

_HISTOGRAM = {"ttft": c.TTFT, "tpot": c.TPOT}


@dataclass(frozen=True, slots=True)
class Objective:
    """One declared SLO of one lane."""

    lane: str
    kind: str  # one of conventions.SLO_KINDS
    objective: float
    threshold_ms: float | None  # latency SLOs only

    @property
    def title(self) -> str:
        """E.g. ``TTFT <= 500 ms for 95%`` or ``availability 99.5%``."""
        share = f"{self.objective * 100:g}%"
        if self.threshold_ms is None:
            return f"{self.kind} {share}"
        return f"{self.kind.upper()} <= {self.threshold_ms:g} ms for {share}"

    def rule(self, name: str) -> str:
        """A recording rule's series for this lane and SLO."""
        return e.selector(name, e.eq(c.LANE, self.lane), e.eq(c.SLO_LABEL, self.kind))


def objectives(lane: Lane) -> list[Objective]:
    """The lane's declared SLOs, in ``SLO_KINDS`` order."""
    out = []
    for kind in c.SLO_KINDS:
        slo = getattr(lane.slo, kind)
        if slo is None:
            continue
        threshold = slo.threshold_ms if isinstance(slo, LatencySLO) else None
        out.append(Objective(lane.name, kind, slo.objective, threshold))
    return out


def long_windows(slo: SLO) -> list[str]:
    """The long windows of the lane's burn-rate alerts, in config order, de-duplicated."""
    return list(dict.fromkeys(w.long for w in slo.burn_windows))


def status_window(config: Config) -> str | None:
    """The long window of the fastest-burning alert (highest factor) of any lane with SLOs."""
    windows = [w for lane in config.lanes if objectives(lane) for w in lane.slo.burn_windows]
    return max(windows, key=lambda w: w.factor).long if windows else None


def le(threshold_ms: float) -> str:
    """The ``le`` label of the histogram bucket that ends exactly at the threshold."""
    return c.bucket_le(round(threshold_ms / 1000, 6))


def goodput(lane: Lane) -> str:
    """Requests per second of ``lane`` that met every SLO (an upper-bound estimate).

    Per-request joint outcomes are only in the events (``vllm-obs query``);
    from histograms the best bound is the smallest of: successful requests,
    and requests within each latency threshold.
    """
    scope = (e.eq(c.LANE, lane.name), e.LANE_VAR, e.POOL_VAR)
    parts = [
        e.tagged(
            e.sum_by(e.rate(e.selector(e.total(c.REQUESTS), *scope, e.eq(c.OUTCOME, c.OK)))),
            "sli",
            "ok",
        )
    ]
    for kind, metric in _HISTOGRAM.items():
        slo = getattr(lane.slo, kind)
        if slo is None:
            continue
        within = e.selector(e.bucket(metric), *scope, e.eq("le", le(slo.threshold_ms)))
        parts.append(e.tagged(e.sum_by(e.rate(within)), "sli", kind))
    return e.agg("min", " or ".join(parts))
