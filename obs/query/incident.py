"""``incident``: the postmortem's first draft, in words, from a window of events.

It opens with the story of each incident (``obs.query.harm``): per pool, the trigger (the
lane whose load rose), the victims ranked by harm with the share of their wait the trigger's
requests were ahead of them, the mechanism and what was fine, and the lever. Then, for each
lane and SLO that missed in the window (``obs.query.error_budget``'s spending): from when to
when (the first and last miss, and the span that holds the middle 90% of them; one time when
they are the same second), the misses against the requests judged and the share of the
window's budget they burned, the phase and cause behind most of them
(``obs.query.error_budget.causes``: the sidecar's stamp, else ``obs.attribution``'s rule)
with what that cause means and the lever the runbook names for it
(``obs.conventions.CAUSE_WORDS``), and the replica and tenant behind most misses. Then the
settings and config changes in the window (``obs.query.changes``) and, given Prometheus, the
alerts that fired in it (its ``ALERTS`` series). Plain data first (``--format json``), then
the words, each line within ``WIDTH`` columns.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from obs.config import Config
from obs.conventions import CAUSE_WORDS
from obs.prom.api import PrometheusAPI, PrometheusError
from obs.query import harm
from obs.query.changes import find_changes
from obs.query.error_budget import COLUMNS, as_utc, budget, spending
from obs.query.scan import Source
from obs.query.table import to_json

ALERT_STEP_S = 15.0  # the resolution at which fired alerts are read back
CHANGE_FIELDS = ("pool", "settings_fingerprint", "config_fingerprint")
WIDTH = 120  # every line of the words fits this many columns
MAX_TOLD = 5  # incidents told in words, the most harmful (JSON: all)
# The labels a fired alert is told by: its lane, SLO and pool; the replica an outlier alert
# names (instance); the GPU (its host: dcgm-exporter's Hostname, hostname after 4.5.3-4.8.2),
# its XID in words and throttle reason of a GPU alert.
ALERT_LABELS = ("lane", "slo", "pool", "severity", "instance", "Hostname", "hostname", "gpu",
                "err_msg", "reason")  # fmt: skip
NEEDED = (*COLUMNS, *CHANGE_FIELDS, *harm.COLUMNS)  # what a draft reads (a report materializes it)


def _iso(t: datetime) -> str:
    return t.isoformat(timespec="seconds")


def _middle(times: list[datetime]) -> tuple[datetime, datetime]:
    """The span holding the middle 90% of ``times`` (sorted)."""
    n = len(times)
    return times[int(0.05 * (n - 1))], times[int(0.95 * (n - 1) + 0.999)]


def draft(
    scan: Source, config: Config, paths: list[str], prometheus: str | None = None
) -> dict[str, Any]:
    """The draft as plain data: the window, each missing SLO, changes, alerts."""
    scan.materialize(NEEDED)  # once, for every query below
    doc = budget(scan, config, paths)
    times: dict[tuple[str, str], list[datetime]] = {}
    for s in spending(scan, config):
        times[(s.lane, s.slo)] = sorted(as_utc(row["_t"]) for _, row in s.misses)
    slos = []
    for e in doc["slos"]:
        if not e["misses"]:
            continue
        t = times[(e["lane"], e["slo"])]
        top = e["by_phase_cause"][0]
        meaning, lever = CAUSE_WORDS.get(top["cause"], ("", ""))
        lo, hi = _middle(t)
        slos.append(
            {
                "lane": e["lane"], "slo": e["slo"], "objective": e["objective"],
                "judged": e["judged"], "misses": e["misses"],
                "budget_spent": e["budget_spent"], "first_miss": _iso(t[0]),
                "last_miss": _iso(t[-1]), "most_from": _iso(lo), "most_until": _iso(hi),
                "phase": top["phase"], "cause": top["cause"],
                "cause_share": top["misses"] / e["misses"], "means": meaning, "lever": lever,
                "causes": e["by_cause"], "top_replica": _top(e["top_replicas"], "replica"),
                "top_tenant": _top(e["top_tenants"], "tenant"),
            }
        )  # fmt: skip
    slos.sort(key=lambda x: -(x["budget_spent"] or 0.0))
    changes = [{"at": _iso(ch.at), "pool": ch.pool, "change": ch.what} for ch in find_changes(scan)]
    since, until = doc["since"], doc["until"]
    if since is None or until is None:  # no window given: the events' own span
        col = scan.dialect.ts_column
        first, last = scan.run(f"SELECT min({col}), max({col}) FROM {scan.source}").rows[0]
        if first is not None:
            since = since or _iso(as_utc(first))
            until = until or _iso(as_utc(last))
    return {
        "since": since,
        "until": until,
        "incidents": harm.stories(scan, config),
        "slos": slos,
        "changes": changes,
        "alerts": _alerts(prometheus, scan, slos) if prometheus else None,
    }


def _top(rows: list[dict[str, Any]], dim: str) -> dict[str, Any] | None:
    return {"value": rows[0][dim], "share": rows[0]["share"]} if rows else None


def _alerts(url: str, scan: Source, slos: list[dict[str, Any]]) -> list[dict[str, Any]] | str:
    """Each alert that fired in the window (Prometheus' ``ALERTS``), first to last seen; or
    why it could not be read."""
    f = scan.filters
    ends = [datetime.fromisoformat(x) for s in slos for x in (s["first_miss"], s["last_miss"])]
    start = f.since or (min(ends) if ends else None)
    end = f.until or (max(ends) if ends else None)
    if start is None or end is None:
        return []
    t0, t1 = (
        t.timestamp() if t.tzinfo else t.replace(tzinfo=UTC).timestamp() for t in (start, end)
    )
    try:
        series = PrometheusAPI(url).query_range(
            'ALERTS{alertstate="firing"}', t0, max(t1, t0 + ALERT_STEP_S), ALERT_STEP_S
        )
    except PrometheusError as e:
        return f"not read from {url}: {e}"
    out = []
    for s in series:
        m, vals = s["metric"], s.get("values") or []
        if not vals:
            continue
        labels = {k: v for k, v in m.items() if k in ALERT_LABELS}
        out.append(
            {
                "alert": m.get("alertname", "?"),
                "labels": labels,
                "from": _iso(datetime.fromtimestamp(float(vals[0][0]), UTC)),
                "until": _iso(datetime.fromtimestamp(float(vals[-1][0]), UTC)),
            }
        )
    return sorted(out, key=lambda a: (a["from"], a["alert"]))


def _clock(at: str, day: str | None) -> str:
    """``at`` as HH:MM:SS when it falls on ``day`` (the draft's first date), else in full."""
    return at[11:19] if day is not None and at[:10] == day else at.replace("T", " ")[:19]


def _span(a: str, b: str, day: str | None) -> str:
    """From ``a`` to ``b``, said once when they are the same second."""
    x, y = _clock(a, day), _clock(b, day)
    return f"at {x}" if x == y else f"from {x} to {y}"


def _wrap(text: str, indent: str = "  ") -> list[str]:
    return textwrap.wrap(text, WIDTH, subsequent_indent=indent, break_on_hyphens=False) or [""]


def harm_done(inc: dict[str, Any]) -> tuple[int, int]:
    """How much an incident hurt: the other lanes' missed requests, then the trigger's own."""
    return sum(v["missed"] for v in inc["victims"]), inc["trigger"].get("missed") or 0


def story_lines(inc: dict[str, Any], day: str | None) -> list[str]:
    """One incident in words: trigger, victims, mechanism, what was fine, lever."""
    t = inc["trigger"]
    who = f"lane {t['lane']}" + (f" (tenant {t['tenant']})" if t.get("tenant") else "")
    when = _span(t["from"], t["until"], day) if t.get("from") else ""
    n = t["requests"]
    lines = _wrap(
        f"Incident on pool {inc['pool']}, {_span(inc['start'], inc['end'], day)}: {who} sent "
        f"{n} request{'s' if n != 1 else ''} ({t['prompt_tokens']} prompt tokens) {when}"
        + (f", {t['missed']} of them missed." if t.get("missed") else ".")
    )
    for v in inc["victims"]:
        small = f" (a small lane: {v['requests']} requests)" if v["small"] else ""
        lines += _wrap(
            f"- Victim: lane {v['lane']} missed {v['missed']} of {v['requests']} requests"
            f"{small}; {t['lane']}'s requests were ahead for {v['trigger_share']:.0%} of their "
            "wait."
        )
    if not inc["victims"]:
        lines.append(f"- No other lane missed: {t['lane']} missed on its own.")
    lines += _wrap(f"  Mechanism: {inc['mechanism']}.", "    ")
    if inc["fine"]:
        lines += _wrap(f"  Fine: {'; '.join(inc['fine'])}.", "    ")
    lines += _wrap(f"  Lever: {inc['lever']}.", "    ")
    return lines


def words(doc: dict[str, Any]) -> str:
    """The draft an SRE starts the postmortem from."""
    day = doc["since"][:10] if doc["since"] else None
    span = f"{doc['since'] or 'the first event'} to {doc['until'] or 'the last event'} (UTC)"
    lines = [f"Incident draft, {span}", ""]
    incidents = doc.get("incidents", [])
    shown = sorted(incidents, key=harm_done, reverse=True)[:MAX_TOLD]
    for inc in (i for i in incidents if i in shown):  # the most harmful, in time order
        lines += [*story_lines(inc, day), ""]
    if len(incidents) > len(shown):
        rest = len(incidents) - len(shown)
        more = f"{rest} more incident{'s' if rest != 1 else ''} with fewer misses"
        lines += [*_wrap(f"{more}: --format json lists every one."), ""]
    if not doc["slos"]:
        lines.append("No lane missed an SLO in the window.")
    elif doc.get("incidents"):
        lines.append("Each lane's misses:")
    for s in doc["slos"]:
        spent = "" if s["budget_spent"] is None else f", {s['budget_spent']:.0%} of its budget"
        most = _span(s["most_from"], s["most_until"], day)
        span_ = _span(s["first_miss"], s["last_miss"], day)
        lines += _wrap(
            f"- Lane {s['lane']} missed its {s['slo']} SLO on {s['misses']} of {s['judged']} "
            f"requests{spent}, {span_}" + ("." if most == span_ else f" (most {most}).")
        )
        lines += _wrap(
            f"  Behind {s['cause_share']:.0%} of it: phase {s['phase']}, cause {s['cause']}: "
            f"{s['means']}.",
            "    ",
        )
        who = []
        if s["top_replica"]:
            who.append(f"replica {s['top_replica']['value']} ({s['top_replica']['share']:.0%})")
        if s["top_tenant"] and s["top_tenant"]["value"] != "-":
            who.append(f"tenant {s['top_tenant']['value']} ({s['top_tenant']['share']:.0%})")
        if who:
            lines += _wrap(f"  Most misses: {', '.join(who)}.", "    ")
        lines += _wrap(f"  Lever (docs/runbook.md, Where the budget went): {s['lever']}.", "    ")
    lines.append("")
    if doc["changes"]:
        lines.append("Changes in the window:")
        for c in doc["changes"]:
            lines += _wrap(f"- {_clock(c['at'], day)} pool {c['pool']}: {c['change']}")
    else:
        lines.append("Changes in the window: no replica settings or lanes config changed.")
    alerts = doc["alerts"]
    if alerts is None:
        lines.append("Alerts: not read (give --prometheus URL).")
    elif isinstance(alerts, str):
        lines += _wrap(f"Alerts: {alerts}.")
    elif not alerts:
        lines.append("Alerts: none fired in the window.")
    else:
        lines.append("Alerts fired:")
        for a in alerts:
            labels = ", ".join(f"{k}={v}" for k, v in sorted(a["labels"].items()))
            lines += _wrap(f"- {a['alert']} ({labels}) {_span(a['from'], a['until'], day)}")
    return "\n".join(lines) + "\n"


def render(doc: dict[str, Any], fmt: str) -> str:
    """The draft as JSON, or in words."""
    return to_json(doc) if fmt == "json" else words(doc)


def text(scan: Source, config: Config, paths: list[str], prometheus: str | None, fmt: str) -> str:
    """``vllm-obs query incident``'s answer: the draft over ``scan``, rendered."""
    return render(draft(scan, config, paths, prometheus), fmt)


def causes_line(doc: dict[str, Any]) -> str:
    """One line: the causes behind every miss of the window, most first."""
    c: Counter[str] = Counter()
    for s in doc["slos"]:
        for r in s["causes"]:
            c[r["cause"]] += r["misses"]
    total = sum(c.values())
    return ", ".join(f"{k} {v / total:.0%}" for k, v in c.most_common()) if total else "none"
