"""What the dashboards read from each lane's SLOs: series, windows, goodput.

The SLO model itself (``Objective``, ``objectives``) is ``obs.slo``, shared with the rules.
"""

from __future__ import annotations

from obs import conventions as c
from obs.config import SLO, Config, Lane
from obs.slo import LATENCY_HISTOGRAMS, Objective, objectives

from . import expr as e

__all__ = ["Objective", "goodput", "long_windows", "objectives", "rule", "status_window"]


def rule(o: Objective, name: str) -> str:
    """A recording rule's series for this lane and SLO."""
    return e.selector(name, e.eq(c.LANE, o.lane), e.eq(c.SLO_LABEL, o.kind))


def long_windows(slo: SLO) -> list[str]:
    """The long windows of the lane's burn-rate alerts, in config order, de-duplicated."""
    return list(dict.fromkeys(w.long for w in slo.burn_windows))


def status_window(config: Config) -> str | None:
    """The long window of the fastest-burning alert (highest factor) of any lane with SLOs."""
    windows = [w for lane in config.lanes if objectives(lane) for w in lane.slo.burn_windows]
    return max(windows, key=lambda w: w.factor).long if windows else None


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
    for o in objectives(lane):
        if o.kind not in LATENCY_HISTOGRAMS:
            continue
        within = e.selector(e.bucket(LATENCY_HISTOGRAMS[o.kind]), *scope, e.eq("le", o.le))
        parts.append(e.tagged(e.sum_by(e.rate(within)), "sli", o.kind))
    return e.agg("min", " or ".join(parts))
