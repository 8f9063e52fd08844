"""Histogram buckets (SLO thresholds merged in exactly) and label values kept bounded."""

from __future__ import annotations

from typing import Final

from obs.conventions.labels import MAX_MODEL_LABELS, OVERFLOW_LABEL

# Latency buckets in seconds; SLO thresholds from the config are merged in
# exactly (see ``latency_buckets``) so every threshold is a bucket boundary.
LATENCY_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    20.0,
    30.0,
    60.0,
    120.0,
)
TOKEN_LATENCY_BUCKETS: Final = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    1.0,
    2.0,
)


def merged_buckets(base: tuple[float, ...], thresholds_s: list[float]) -> tuple[float, ...]:
    """``base`` plus every threshold (seconds), sorted, de-duplicated."""
    return tuple(sorted({*base, *(round(t, 6) for t in thresholds_s)}))


def bucket_le(seconds: float) -> str:
    """The ``le`` label value prometheus_client writes for a bucket bound."""
    return repr(float(seconds))


class BoundedLabel:
    """Caps the distinct values a user-controlled label may take.

    Values in ``allowed`` (and those ``allow`` adds, up to ``MAX_MODEL_LABELS``)
    always pass; up to ``cap`` other distinct values pass in arrival order;
    anything after that folds into ``other``.
    """

    __slots__ = ("_allowed", "_cap", "_seen")

    def __init__(self, allowed: tuple[str, ...] = (), cap: int = MAX_MODEL_LABELS) -> None:
        self._allowed = frozenset(allowed)
        self._cap = cap
        self._seen: set[str] = set()

    def allow(self, values: tuple[str, ...]) -> None:
        """Known good values (e.g. the models a pool reports it serves) from now on."""
        new = [v for v in values if v not in self._allowed and len(v) <= 128]
        room = MAX_MODEL_LABELS - len(self._allowed)
        if new and room > 0:
            self._allowed = self._allowed | frozenset(new[:room])

    def __call__(self, value: str | None) -> str:
        if not value:
            return OVERFLOW_LABEL
        if value in self._allowed or value in self._seen:
            return value
        if len(self._seen) < self._cap and len(value) <= 128:
            self._seen.add(value)
            return value
        return OVERFLOW_LABEL
