"""What a metric family is: its full name, type, help text and label names."""

from __future__ import annotations

from dataclasses import dataclass

from obs.conventions.labels import NAMESPACE


@dataclass(frozen=True, slots=True)
class Metric:
    """One exported metric: its full name, type, help text and label names."""

    name: str
    kind: str  # counter | histogram | gauge
    help: str
    labels: tuple[str, ...]

    @property
    def series(self) -> tuple[str, ...]:
        """The sample names Prometheus stores for this metric."""
        if self.kind == "counter":
            return (f"{self.name}_total",)
        if self.kind == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)


def _m(name: str, kind: str, help_: str, *labels: str) -> Metric:
    return Metric(f"{NAMESPACE}_{name}", kind, help_, labels)
