"""promtool test groups for one lane's SLO rules.

Per SLO: one group where the error ratio burns above every window's factor
(each window is checked pending before its ``for`` and firing after it, with
the recorded SLI, burn rate, objective and budget checked too); one group per
distinct factor where the ratio burns just below it (that window stays silent
while slower-factor windows fire); for availability, one group with no
failures at all (the SLI is 0, not missing).
"""

from __future__ import annotations

import math
from typing import Any

from obs import conventions as c

from . import series as s
from . import timeline as tl
from .model import SLI, AlertModel
from .rules import RuleIndex

REQUESTS_PER_STEP = 10_000
ACTIVE_S = 60  # rate() needs two samples: conditions hold from the second minute on


def lane_tests(model: AlertModel, lane: str, index: RuleIndex) -> list[dict[str, Any]]:
    """The one-minute test groups for the SLOs of ``lane`` (the evidence floor's hours-long
    groups are in ``promtool_evidence``, a file of their own)."""
    groups = []
    for sli in model.lane_slis(lane):
        groups.append(_burning(sli, index))
        factors = sorted({w.factor for w in sli.windows})
        for i, f in enumerate(factors):
            below = factors[i - 1] if i else 0.0
            groups.append(_just_below(sli, index, (f + below) / 2, f))
        if sli.kind == "availability":
            groups.append(_no_failures(sli, index))
    return groups


def _bad_for(sli: SLI, burn: float) -> tuple[int, float]:
    """Failed requests per step for ``burn``, nudged off a %.1f rounding edge."""
    bad = round(burn * sli.budget * REQUESTS_PER_STEP)
    while any(
        abs((bad / REQUESTS_PER_STEP / sli.budget * share * 10) % 1 - 0.5) < 1e-3
        for share in (1.0, s.TOP_SHARE)  # the burn, and its top phase and cause's part
    ):
        bad += 1
    actual = bad / REQUESTS_PER_STEP / sli.budget
    for w in sli.windows:
        if abs(actual - w.factor) < 0.01 * w.factor:
            raise ValueError(f"test burn {actual} too close to factor {w.factor} of {sli}")
    return bad, actual


def _expected(sli: SLI, index: RuleIndex, burn: float, t_s: int) -> list[dict[str, Any]]:
    return [
        s.expected(
            index.find(
                sli.alert, lane=sli.lane, slo=sli.kind, long_window=w.long, short_window=w.short
            ),
            {},
            burn,
        )
        for w in sli.windows
        if burn > w.factor and tl.fires_by(t_s, ACTIVE_S, w.for_)
    ]


def _burning(sli: SLI, index: RuleIndex) -> dict[str, Any]:
    top = max(w.factor for w in sli.windows)
    burn = round(min(2 * top, (top + 1 / sli.budget) / 2), 1)
    bad, actual = _bad_for(sli, burn)
    times = set()
    for w in sli.windows:
        pending = tl.pending_time(ACTIVE_S, w.for_)
        if pending is not None:
            times.add(pending)
        times.add(tl.firing_time(ACTIVE_S, w.for_))
    end = max(times)
    inputs = s.sli_inputs(sli, REQUESTS_PER_STEP, bad, end // tl.STEP_S + 1)
    alerts = [tl.alert_test(sli.alert, t, _expected(sli, index, actual, t)) for t in sorted(times)]
    return tl.group(
        f"{sli.lane} {sli.kind}: {bad} of {REQUESTS_PER_STEP} requests bad ({actual:g}x the "
        "budget): every window pends for its `for`, then fires",
        inputs,
        alerts,
        _recorded(sli, bad, actual, end),
    )


def _just_below(sli: SLI, index: RuleIndex, burn: float, factor: float) -> dict[str, Any]:
    bad, actual = _bad_for(sli, burn)
    end = max(tl.firing_time(ACTIVE_S, w.for_) for w in sli.windows if w.factor == factor)
    inputs = s.sli_inputs(sli, REQUESTS_PER_STEP, bad, end // tl.STEP_S + 1)
    exp = _expected(sli, index, actual, end)
    return tl.group(
        f"{sli.lane} {sli.kind}: burning {actual:g}x, below {factor:g}x: those windows stay silent",
        inputs,
        [tl.alert_test(sli.alert, end, exp)],
    )


def _no_failures(sli: SLI, index: RuleIndex) -> dict[str, Any]:
    end = min(tl.firing_time(ACTIVE_S, w.for_) for w in sli.windows)
    inputs = s.sli_inputs(sli, REQUESTS_PER_STEP, 0, end // tl.STEP_S + 1)
    window = sli.rule_windows[0]
    expr = {
        "expr": _sel(c.sli_error_rule(window), sli),
        "eval_time": tl.minute(end),
        "exp_samples": [{"labels": _sel(c.sli_error_rule(window), sli), "value": 0}],
    }
    return tl.group(
        f"{sli.lane} {sli.kind}: no failed request (no error series): the SLI is 0, silent",
        inputs,
        [tl.alert_test(sli.alert, end, [])],
        [expr],
    )


def _sel(name: str, sli: SLI) -> str:
    return f'{name}{{{c.LANE}="{sli.lane}",{c.SLO_LABEL}="{sli.kind}"}}'


def _rounded(x: float, to: float) -> float:
    """PromQL's ``round(x, to)``."""
    inverse = 1.0 / to
    return math.floor(x * inverse + 0.5) / inverse


def _recorded(sli: SLI, bad: int, burn: float, t_s: int) -> list[dict[str, Any]]:
    """The recording rules' values at ``t_s`` for a constant error ratio."""
    labels = f'{{{c.LANE}="{sli.lane}",{c.SLO_LABEL}="{sli.kind}"}}'
    window = sli.rule_windows[0]
    checks = [
        (c.sli_error_rule(window), 0.0001, bad / REQUESTS_PER_STEP),
        (c.burn_rate_rule(sli.rule_windows[-1]), 0.001, burn),
        (c.ERROR_BUDGET_REMAINING_RULE, 0.001, 1 - burn),
    ]
    out: list[dict[str, Any]] = [
        {
            "expr": _sel(c.SLO_OBJECTIVE_RULE, sli),
            "eval_time": tl.minute(t_s),
            "exp_samples": [{"labels": _sel(c.SLO_OBJECTIVE_RULE, sli), "value": sli.objective}],
        }
    ]
    for name, to, value in checks:
        out.append(
            {
                "expr": f"round({_sel(name, sli)}, {to})",
                "eval_time": tl.minute(t_s),
                "exp_samples": [{"labels": labels, "value": _rounded(value, to)}],
            }
        )
    return out
