"""When an alert is pending and when it fires, on promtool's one-minute evaluation grid."""

from __future__ import annotations

import math
from typing import Any

from obs.durations import seconds

STEP_S = 60


def minute(t_s: int) -> str:
    """An eval_time promtool reads: ``17m``."""
    return f"{t_s // STEP_S}m"


def fires_by(t_s: int, active_s: int, for_: str) -> bool:
    """Whether an alert whose condition holds from ``active_s`` on fires at ``t_s``."""
    return t_s >= active_s + seconds(for_)


def pending_time(active_s: int, for_: str) -> int | None:
    """A time, a step clear of the edge, when the alert is still pending (None if none)."""
    fire_at = active_s + seconds(for_)
    t = math.ceil(fire_at / STEP_S) * STEP_S - 2 * STEP_S
    return t if t >= active_s else None


def firing_time(active_s: int, for_: str) -> int:
    """A time, a step clear of the edge, when the alert fires."""
    return math.ceil((active_s + seconds(for_)) / STEP_S) * STEP_S + 2 * STEP_S


def alert_test(alert: str, t_s: int, exp: list[dict[str, Any]]) -> dict[str, Any]:
    """One ``alert_rule_test`` entry."""
    return {"eval_time": minute(t_s), "alertname": alert, "exp_alerts": exp}


def group(
    name: str,
    inputs: list[dict[str, str]],
    alerts: list[dict[str, Any]],
    exprs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One promtool test group on a one-minute grid."""
    out: dict[str, Any] = {"name": name, "interval": minute(STEP_S), "input_series": inputs}
    if exprs:
        out["promql_expr_test"] = exprs
    out["alert_rule_test"] = alerts
    return out
