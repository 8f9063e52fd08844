"""SLO rules per lane: SLI error ratios, burn rates, error budget, burn-rate alerts.

For each SLO of a lane (``slo`` label: ttft, tpot or availability):

* ``sli_error_rule(w)``: share of requests that broke the SLO over each window ``w``
  the alerts read (and over the SLO period, for the budget);
* ``burn_rate_rule(w)``: that share divided by the error budget (1 - objective);
* ``SLO_OBJECTIVE_RULE`` and ``ERROR_BUDGET_REMAINING_RULE`` (1 - burn over the period);
* one multi-window alert per burn window: both windows burn above the factor.
"""

from __future__ import annotations

from typing import Any

from obs import conventions as c
from obs.durations import seconds

from . import expr as e
from .budget_rules import alert_annotations, lane_budget_rules
from .holders import holder_note
from .model import SLI, AlertModel, Window

Rule = dict[str, Any]
Group = dict[str, Any]

# The period rules scan 30 days of samples; once every 5 minutes is plenty for a budget.
PERIOD_INTERVAL = "5m"

_TITLE = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL p95", "availability": "availability"}


def lane_groups(model: AlertModel, lane: str) -> list[Group]:
    """The rule groups of one lane: fast windows and alerts, then the SLO period."""
    slis = model.lane_slis(lane)
    fast: list[Rule] = []
    for sli in slis:
        fast += [_sli_error(sli, w) for w in sli.rule_windows]
        fast += [_burn_rate(sli, w) for w in sli.rule_windows]
    fast += lane_budget_rules(model, lane)
    for sli in slis:
        fast += [_burn_alert(model, sli, w) for w in sli.windows]
    period: list[Rule] = []
    for sli in slis:
        period += _period(sli)
    return [
        {"name": f"vllm-obs-slo-{lane}", "rules": fast},
        {"name": f"vllm-obs-slo-{lane}-period", "interval": PERIOD_INTERVAL, "rules": period},
    ]


def _series(sli: SLI) -> tuple[str, str]:
    return e.eq(c.LANE, sli.lane), e.eq(c.SLO_LABEL, sli.kind)


def _labels(sli: SLI) -> dict[str, str]:
    """Every SLO series carries lane and slo (also keeps rules distinct for promtool)."""
    return {c.LANE: sli.lane, c.SLO_LABEL: sli.kind}


def _sli_error(sli: SLI, window: str) -> Rule:
    return {
        "record": c.sli_error_rule(window),
        "expr": e.sli_error(sli, window),
        "labels": _labels(sli),
    }


def _burn_rate(sli: SLI, window: str) -> Rule:
    sel = e.selector(c.sli_error_rule(window), *_series(sli))
    return {
        "record": c.burn_rate_rule(window),
        "expr": f"{sel} / {e.num(sli.budget)}",
        "labels": _labels(sli),
    }


def _period(sli: SLI) -> list[Rule]:
    period = c.SLO_PERIOD
    burn = e.selector(c.burn_rate_rule(period), *_series(sli))
    return [
        {
            "record": c.SLO_OBJECTIVE_RULE,
            "expr": f"vector({e.num(sli.objective)})",
            "labels": _labels(sli),
        },
        _sli_error(sli, period),
        _burn_rate(sli, period),
        {"record": c.ERROR_BUDGET_REMAINING_RULE, "expr": f"1 - {burn}", "labels": _labels(sli)},
    ]


def describe(sli: SLI) -> str:
    """The SLO in words: ``95% of requests with TTFT <= 500 ms``."""
    share = f"{sli.objective * 100:g}%"
    if sli.threshold_ms is None:
        return f"{share} of requests served without a server-side error"
    return f"{share} of requests with {_TITLE[sli.kind]} <= {sli.threshold_ms:g} ms"


def _notes(model: AlertModel, sli: SLI, window: str) -> dict[str, str]:
    """The top phase and cause, then who else holds the lane's pool (alerts/holders.py)."""
    notes = alert_annotations(model, sli, window)
    notes["top_cause"] += holder_note(sli.pool, sli.lane)
    return notes


def _burn_alert(model: AlertModel, sli: SLI, w: Window) -> Rule:
    factor = e.num(w.factor)
    cond = [
        f"{e.selector(c.burn_rate_rule(win), *_series(sli))} > {factor}"
        for win in (w.long, w.short)
    ]
    # Evidence: enough requests in each window, so one slow request of two never pages.
    enough = [
        e.enough(c.LANE, e.requests_in(sli, win), sli.floor(w, win)) for win in (w.long, w.short)
    ]
    title = _TITLE[sli.kind]
    value = '{{ printf "%.1f" $value }}'
    days = seconds(c.SLO_PERIOD) / 86400 / w.factor
    pace = f" At {factor}x the {c.SLO_PERIOD} budget is gone in {days:.1f} days."
    return {
        "alert": sli.alert,
        "expr": "\n".join([cond[0], "and", cond[1], *enough]),
        "for": w.for_,
        "labels": {
            c.SEVERITY: w.severity,
            c.LANE: sli.lane,
            c.POOL: sli.pool,
            c.SLO_LABEL: sli.kind,
            c.LONG_WINDOW: w.long,
            c.SHORT_WINDOW: w.short,
        },
        "annotations": {
            "summary": (
                f"Lane {sli.lane} burns its {title} error budget {value}x too fast "
                f"over {w.long} (threshold {factor}x)"
            ),
            "description": (
                f"Lane {sli.lane} (pool {sli.pool}) spent its {title} error budget at "
                f"{value}x the sustainable rate over the last {w.long}, and still above "
                f"{factor}x over the last {w.short}. SLO: {describe(sli)} over "
                f"{c.SLO_PERIOD} (error budget {e.num(sli.budget * 100)}% of requests), "
                f"with at least {sli.min_requests} requests over {w.long}.{pace}"
            ),
            "runbook_url": model.runbook(sli.alert),
            **_notes(model, sli, w.long),
        },
    }
