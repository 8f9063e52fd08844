"""Postmortem queries over request event logs (JSONL, rotated/gzipped, or Parquet).

The Python API returns pandas DataFrames::

    import obs.query as q

    q.summary("logs/events.jsonl*", filters={"since": "2h"})
    q.slowest("logs/", by="ttft", n=20)
    q.timeline("logs/", interval="5m")
    q.compare("before.jsonl", "after.jsonl")
    q.budget("logs/", window="1h")  # where each lane's error budget went (a dict)
    q.report("logs/", "out/report")

The names load lazily so ``vllm-obs query`` starts without pandas.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from obs.query.api import (
        budget,
        compare,
        events,
        export,
        open_scan,
        report,
        show,
        slowest,
        summary,
        timeline,
    )
    from obs.query.filters import Filters

__all__ = [
    "Filters",
    "budget",
    "compare",
    "events",
    "export",
    "open_scan",
    "report",
    "show",
    "slowest",
    "summary",
    "timeline",
]


def __getattr__(name: str) -> Any:
    if name == "Filters":
        from obs.query.filters import Filters

        return Filters
    if name in __all__:
        from obs.query import api

        return getattr(api, name)
    raise AttributeError(f"module 'obs.query' has no attribute {name!r}")
