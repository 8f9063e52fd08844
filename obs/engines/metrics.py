"""The engine-neutral pool state: what the sidecar exports per replica, whatever the engine.

An engine adapter (``obs.engines.adapters``) maps one engine's own ``/metrics`` samples to
an :class:`EngineState`. A value the engine does not report is ``None`` (absent),
never 0: the sidecar then exports no gauge for it, the dashboards show "not
reported by this engine" and no alert is judged on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields

# The fields of EngineState that carry engine values (all but ``engine``).
STATE_FIELDS = (
    "kv_cache_usage",
    "running",
    "waiting",
    "prefix_queries",
    "prefix_hits",
    "preemptions",
)


@dataclass(frozen=True, slots=True)
class EngineState:
    """One replica's engine state; ``None`` where its engine does not report the value."""

    engine: str
    kv_cache_usage: float | None
    running: float | None
    waiting: float | None
    prefix_queries: float | None
    prefix_hits: float | None
    preemptions: float | None
    models: tuple[str, ...] = ()  # the model_name values the replica's samples carry

    def reported(self) -> frozenset[str]:
        """The names of the state values this state carries (engine and models aside)."""
        return frozenset(
            f.name
            for f in fields(self)
            if f.name not in ("engine", "models") and getattr(self, f.name) is not None
        )


@dataclass(frozen=True, slots=True)
class Sums:
    """Each sample name's sum over its label sets, and how many label sets it had."""

    totals: Mapping[str, tuple[float, int]]

    @classmethod
    def of(cls, samples: Iterable[tuple[str, float]]) -> Sums:
        """Sum ``(name, value)`` samples by name; NaN samples are left out."""
        totals: dict[str, tuple[float, int]] = {}
        for name, value in samples:
            if value != value:  # NaN: the engine has no value yet
                continue
            total, n = totals.get(name, (0.0, 0))
            totals[name] = (total + value, n + 1)
        return cls(totals)

    def sum(self, name: str) -> float | None:
        """The sum over all label sets, or ``None`` if the page has no such sample."""
        found = self.totals.get(name)
        return None if found is None else found[0]

    def mean(self, name: str) -> float | None:
        """The mean over label sets (e.g. KV usage of several engine cores), or ``None``."""
        found = self.totals.get(name)
        return None if found is None else found[0] / found[1]

    def names(self) -> Iterable[str]:
        return self.totals.keys()


def plus(*values: float | None) -> float | None:
    """The sum of the values, or ``None`` if any is absent."""
    total = 0.0
    for v in values:
        if v is None:
            return None
        total += v
    return total
