"""Data links: from latency panels to traces in Tempo, and between dashboards.

Trace links open Grafana Explore on the ``$traces`` datasource with a TraceQL
search over the sidecar's spans (attributes as the OTel exporter writes them),
limited to spans slower than the clicked value and to the dashboard's time
range. Template and data-link variables (``${...}``) are left unencoded so
Grafana fills them in when the link is followed.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final
from urllib.parse import quote

from obs import conventions as c

from .variables import DATASOURCE, TEMPO, TRACES

# Span attributes the sidecar's OpenTelemetry exporter sets (named in obs.conventions).
LANE_ATTR: Final = c.ATTR_LANE
PHASE_ATTR: Final = c.ATTR_PHASE

OVERVIEW_UID: Final = "vllm-obs-overview"
LANE_UID: Final = "vllm-obs-lane"
POOLS_UID: Final = "vllm-obs-pools"
ADMISSION_UID: Final = "vllm-obs-admission"
SLO_UID: Final = "vllm-obs-slo"

_PLACEHOLDER = re.compile(r"\$\{[^}]+\}")


def _encode(text: str) -> str:
    """Percent-encode ``text`` but keep every ``${...}`` for Grafana to interpolate."""
    kept: list[str] = []

    def hold(m: re.Match[str]) -> str:
        kept.append(m.group(0))
        return f"\x00{len(kept) - 1}\x00"

    out = quote(_PLACEHOLDER.sub(hold, text), safe="")
    return re.sub(r"%00(\d+)%00", lambda m: kept[int(m.group(1))], out)


def explore_traces(title: str, traceql: str) -> dict[str, Any]:
    """A data link that runs ``traceql`` in Explore on the ``$traces`` datasource."""
    pane = {
        "datasource": f"${{{TRACES}}}",
        "queries": [
            {
                "refId": "A",
                "datasource": TEMPO,
                "queryType": "traceql",
                "query": traceql,
                "limit": 20,
            }
        ],
        "range": {"from": "${__from}", "to": "${__to}"},
    }
    panes = json.dumps({"traces": pane}, separators=(",", ":"), sort_keys=True)
    return {
        "title": title,
        "url": f"/explore?schemaVersion=1&panes={_encode(panes)}",
        "targetBlank": True,
    }


def slower_lane_traces(lane: str) -> dict[str, Any]:
    """Traces of ``lane`` (a label or variable reference) slower than the clicked value.

    A request whose TTFT (or any phase) exceeds the value also lasts longer
    than it, so one duration filter serves every latency panel.
    """
    query = f'{{ span.{LANE_ATTR} =~ "{lane}" && kind = server && duration > ${{__value.raw}}s }}'
    return explore_traces("Traces of this lane slower than this", query)


def slower_phase_traces(lane: str) -> dict[str, Any]:
    """Phase spans (children of the lane's request span) slower than the clicked value."""
    query = (
        f'{{ span.{LANE_ATTR} =~ "{lane}" }} > '
        f'{{ span.{PHASE_ATTR} = "${{__field.labels.phase}}" && duration > ${{__value.raw}}s }}'
    )
    return explore_traces("Slow spans of this phase", query)


def lane_drilldown() -> dict[str, Any]:
    """Open the lane drill-down for the clicked series' lane, same time range and datasource."""
    return {
        "title": "Lane drill-down: ${__field.labels.lane}",
        "url": (
            f"/d/{LANE_UID}/{LANE_UID}?var-lane=${{__field.labels.lane}}"
            f"&${{{DATASOURCE}:queryparam}}&${{__url_time_range}}"
        ),
        "targetBlank": False,
    }
