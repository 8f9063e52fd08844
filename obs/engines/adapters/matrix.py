"""The engine matrix of docs/reference.md, from the adapters (``python -m obs.reference``).

What each engine reports, which panels and alerts apply to its pools, and how it
fills the event fields that depend on the engine.
"""

from __future__ import annotations

from obs import conventions as c
from obs.engines.adapters import ADAPTERS
from obs.engines.metrics import STATE_FIELDS

# Each pool-state value: its label here, the panels that show it, the alerts judged on it.
USES = {
    "kv_cache_usage": (
        "KV cache usage",
        "KV cache usage; KV cache usage of each lane's pool",
        c.ALERT_KV_CACHE_USAGE_HIGH,
    ),
    "running": ("running", "Running and waiting", "-"),
    "waiting": ("waiting", "Running and waiting", "-"),
    "prefix_queries": (
        "prefix-cache lookups",
        "Prefix-cache hit ratio by pool; of each lane's pool",
        c.ALERT_PREFIX_CACHE_HIT_RATIO_LOW,
    ),
    "prefix_hits": ("prefix-cache hits", "(same as lookups)", c.ALERT_PREFIX_CACHE_HIT_RATIO_LOW),
    "preemptions": ("preemptions", "Preemptions", c.ALERT_POOL_PREEMPTING),
}


def engine_table() -> str:
    """Markdown: one row per pool-state value, one column per engine."""
    names = list(ADAPTERS)
    rows = [
        "| pool-state value | panels | alert | " + " | ".join(f"`{n}`" for n in names) + " |",
        "|---" * (3 + len(names)) + "|",
    ]
    for field in STATE_FIELDS:
        label, panels, alert = USES[field]
        marks = ["yes" if field in ADAPTERS[n].reports else "not reported" for n in names]
        alert_cell = f"`{alert}`" if alert != "-" else "-"
        rows.append(f"| {label} | {panels} | {alert_cell} | " + " | ".join(marks) + " |")
    rows.append(
        "| `serve` flags | | | " + " | ".join(ADAPTERS[n].serve_flags for n in names) + " |"
    )
    rows.append("| tested against | | | " + " | ".join(ADAPTERS[n].tested for n in names) + " |")
    return "\n".join(rows)


def event_table() -> str:
    """Markdown: the event fields that depend on the engine, one column per engine."""
    names = list(ADAPTERS)
    fields = list(dict.fromkeys(f for a in ADAPTERS.values() for f in a.events))
    rows = [
        "| event field | " + " | ".join(f"`{n}`" for n in names) + " |",
        "|---" * (1 + len(names)) + "|",
    ]
    for field in fields:
        cells = [ADAPTERS[n].events.get(field, "yes") for n in names]
        rows.append(f"| `{field}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)
