"""Where a lane's error budget burns: the burn rate split by phase and cause, and what the
burn-rate alerts say about it.

For each window the lane's alerts read, ``burn_by_cause_rule(w)`` splits each SLO's burn rate
over the phases and causes of its misses (``vllm_obs_slo_misses_total``, attributed by
``obs.attribution``) in proportion to their counts, and ``burn_by_phase_rule(w)`` sums those
over causes. Each burn-rate alert names the phase and cause burning most at the time it fires
(a template query over those rules), the lever the runbook names for that cause (the words
of ``vllm-obs query incident``: ``obs.conventions.CAUSE_WORDS``), and the ``vllm-obs query
budget`` command to run.
"""

from __future__ import annotations

from typing import Any

from obs import conventions as c

from . import expr as e
from .model import SLI, AlertModel

Rule = dict[str, Any]


def lane_budget_rules(model: AlertModel, lane: str) -> list[Rule]:
    """The lane's burn by phase and cause over every window its alerts read."""
    slis = model.lane_slis(lane)
    windows = sorted({w for sli in slis for w in sli.rule_windows}, key=_order(slis))
    (misses,) = c.SLO_MISSES.series
    sel = e.selector(misses, e.eq(c.LANE, lane))
    by_cause = (c.LANE, c.SLO_LABEL, c.PHASE, c.CAUSE)
    rules: list[Rule] = []
    for w in windows:
        part = e.agg("sum", e.rate(sel, w), *by_cause)
        whole = e.agg("sum", e.rate(sel, w), c.LANE, c.SLO_LABEL)
        burn = e.selector(c.burn_rate_rule(w), e.eq(c.LANE, lane))
        on = f"on ({c.LANE}, {c.SLO_LABEL}) group_left ()"
        rules.append(
            {
                "record": c.burn_by_cause_rule(w),
                "expr": f"(\n  {part}\n  / {on}\n  {e.positive(whole)}\n)\n* {on}\n{burn}",
            }
        )
        rules.append(
            {
                "record": c.burn_by_phase_rule(w),
                "expr": e.agg(
                    "sum",
                    e.selector(c.burn_by_cause_rule(w), e.eq(c.LANE, lane)),
                    c.LANE,
                    c.SLO_LABEL,
                    c.PHASE,
                ),
            }
        )
    return rules


def _order(slis: tuple[SLI, ...]) -> Any:
    order = {w: i for sli in slis for i, w in enumerate(sli.rule_windows)}
    return lambda w: order[w]


def top_cause_query(sli: SLI, window: str) -> str:
    """PromQL: the phase and cause burning most of the SLI's budget over ``window``."""
    sel = e.selector(
        c.burn_by_cause_rule(window), e.eq(c.LANE, sli.lane), e.eq(c.SLO_LABEL, sli.kind)
    )
    return f"topk(1, {sel})"


def query_command(model: AlertModel, sli: SLI, window: str) -> str:
    """The ``vllm-obs query budget`` command for the SLI's lane over ``window``."""
    return f"vllm-obs query budget --lane {sli.lane} --window {window} {model.events}"


def lever_template(cause: str = ".Labels.cause") -> str:
    """A Go template: the lever the runbook names for the cause in ``cause`` (a template
    field), in the words of ``vllm-obs query incident`` (``obs.conventions.CAUSE_WORDS``)."""
    arms = [
        f'{{{{ {"if" if i == 0 else "else if"} eq {cause} "{name}" }}}}{lever}'
        for i, (name, (_, lever)) in enumerate(c.CAUSE_WORDS.items())
    ]
    return "".join(arms) + "{{ end }}"


def alert_annotations(model: AlertModel, sli: SLI, window: str) -> dict[str, str]:
    """What a burn-rate alert on ``sli`` adds: the top phase and cause with the runbook's
    lever for it, the command to run."""
    top = (
        f"{{{{ range query `{top_cause_query(sli, window)}` }}}}"
        "phase {{ .Labels.phase }}, cause {{ .Labels.cause }} "
        '(burning {{ printf "%.1f" .Value }}x the sustainable rate); lever: '
        f"{lever_template()}"
        "{{ else }}no attributed misses{{ end }}"
    )
    return {
        "top_cause": f"Over the last {window}, most of the budget went to: {top}.",
        "budget_query": query_command(model, sli, window),
    }
