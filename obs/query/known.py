"""The names a query may filter on: every lane, pool, model and tenant the log or the
lanes config knows. A filter value neither knows is a typo (``--lane chatt``), and a query
over it would answer "nothing missed" about nothing: refused instead, naming the known ones.
"""

from __future__ import annotations

from collections.abc import Callable

from obs.config import Config
from obs.errors import InputError
from obs.query.filters import Filters
from obs.query.scan import SRC, Source

# Filter flag -> the event column it filters.
DIMENSIONS = ("lane", "pool", "model", "tenant")
SHOWN = 30  # known names listed in the error at most


def asked(filters: Filters) -> dict[str, tuple[str, ...]]:
    """The dimension values ``filters`` asks for, by dimension (only those it filters)."""
    values = {
        "lane": filters.lanes,
        "pool": filters.pools,
        "model": filters.models,
        "tenant": filters.tenants,
    }
    return {dim: v for dim, v in values.items() if v}


def from_config(config: Config | None) -> dict[str, set[str]]:
    """The names the lanes config declares, by dimension."""
    out: dict[str, set[str]] = {dim: set() for dim in DIMENSIONS}
    if config is None:
        return out
    out["lane"].update(config.lane_names)
    out["pool"].update(p.name for p in config.pools)
    out["model"].update(p.model for p in config.pools if p.model)
    out["tenant"].update(config.tenants)
    return out


def from_log(scan: Source) -> dict[str, set[str]]:
    """The names the events of ``scan`` carry, by dimension."""
    cols = ", ".join(DIMENSIONS)
    table = scan.run(f"SELECT {cols} FROM {SRC} WHERE request_id IS NOT NULL GROUP BY {cols}")
    return {dim: {str(v) for v in table.values(dim) if v not in (None, "")} for dim in DIMENSIONS}


def check(
    filters: Filters, open_unfiltered: Callable[[Filters], Source], config: Config | None
) -> None:
    """Raise ``InputError`` (exit 2) for a lane, pool, model or tenant in ``filters`` that
    neither the whole log (read through ``open_unfiltered``, without the filters) nor the
    config knows; nothing is read when no dimension is filtered."""
    wanted = asked(filters)
    if not wanted:
        return
    known = from_config(config)
    for dim, names in from_log(open_unfiltered(Filters())).items():
        known[dim] |= names
    for dim, values in wanted.items():
        unknown = [v for v in values if v not in known[dim]]
        if unknown:
            every = sorted(known[dim])
            listed = ", ".join(every[:SHOWN]) + (
                f" (+{len(every) - SHOWN} more)" if len(every) > SHOWN else ""
            )
            raise InputError(
                f"unknown {dim} {', '.join(map(repr, unknown))}: the log and the config know "
                f"{listed or f'no {dim}'}"
            )
