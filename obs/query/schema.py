"""Column names and SQL types of the event log, derived from ``obs.events.Event``.

The query engine reads every log through one canonical column list, so a
field added to ``Event`` is queryable without touching this package, and a
log written by an older schema (a field missing) reads that field as null.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Final

from obs.conventions import PHASES
from obs.errors import InputError
from obs.events import Event

_SQL_TYPES: Final = {"str": "VARCHAR", "int": "BIGINT", "float": "DOUBLE", "bool": "BOOLEAN"}

# Timestamps are read as TIMESTAMPTZ (so offsets other than Z are honoured) and
# handed to queries as naive UTC TIMESTAMP.
TS: Final = "ts"


def _sql_type(name: str, annotation: object) -> str:
    if name == TS:
        return "TIMESTAMPTZ"
    base = str(annotation).split("|")[0].strip()
    return _SQL_TYPES.get(base, "VARCHAR")


# Every event field and its DuckDB type, in schema order.
COLUMNS: Final[dict[str, str]] = {f.name: _sql_type(f.name, f.type) for f in fields(Event)}

PHASE_COLUMNS: Final = tuple(f"{p}_ms" for p in PHASES)

# The timings a query can rank or summarise, by short name -> event column.
TIMINGS: Final[dict[str, str]] = {
    **{p: f"{p}_ms" for p in PHASES},
    "e2e": "e2e_ms",
    "ttft": "ttft_ms",
    "tpot": "tpot_ms",
    "itl": "itl_p50_ms",
    "itl_p95": "itl_p95_ms",
    "itl_max": "itl_max_ms",
    "stream_blocked": "stream_blocked_ms",
    "engine_queue": "engine_queue_ms",
    "engine_prefill": "engine_prefill_ms",
    "engine_decode": "engine_decode_ms",
    "engine_ttft": "engine_ttft_ms",
}

# Dimensions that filters accept.
DIMENSIONS: Final = ("lane", "pool", "model", "tenant", "status")
# Fields ``summary --by`` and ``timeline --by`` can group on.
GROUP_BY: Final = (
    "lane",
    "pool",
    "model",
    "tenant",
    "replica",
    "status",
    "error_class",
    "error_phase",
    "rejection_reason",
    "finish_reason",
)
# Grouping on these describes failures: latency percentiles then cover every request.
OUTCOME_GROUPS: Final = ("status", "error_class", "error_phase", "rejection_reason")


def timing_column(name: str) -> str:
    """The event column for a timing given by short name (``ttft``) or column (``ttft_ms``)."""
    if name in TIMINGS:
        return TIMINGS[name]
    if name in TIMINGS.values():
        return name
    raise InputError(f"unknown timing {name!r}; choose one of: {', '.join(TIMINGS)}")
