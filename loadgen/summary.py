"""The end-of-run summary: per class counts, errors, latency percentiles, throughput. Pure.

TTFT and end-to-end percentiles are over requests; ITL percentiles pool every
gap between output chunks of the class's requests (not a percentile of
per-request percentiles). Tokens/s is the class's completion tokens divided by
the run's wall time. Percentiles are nearest-rank, as in the sidecar.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from obs.loadgen.mix import CLASS_NAMES
from obs.loadgen.records import Record

NS_PER_MS = 1_000_000


def quantile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of an ascending sequence (``q`` in 0..1); None when empty."""
    if not sorted_values:
        return None
    rank = max(0, min(len(sorted_values) - 1, int(q * len(sorted_values) + 0.999999) - 1))
    return sorted_values[rank]


@dataclass(frozen=True, slots=True)
class Percentiles:
    p50: float | None
    p95: float | None
    p99: float | None

    @classmethod
    def of(cls, values: Iterable[float]) -> Percentiles:
        v = sorted(values)
        return cls(quantile(v, 0.5), quantile(v, 0.95), quantile(v, 0.99))


@dataclass(frozen=True, slots=True)
class ClassSummary:
    """One row of the summary table."""

    client_class: str
    requests: int
    errors: int
    ttft_ms: Percentiles
    itl_ms: Percentiles
    e2e_ms: Percentiles
    completion_tokens: int
    tokens_per_s: float


class SummaryBuilder:
    """Collects records (and each one's raw ITL gaps) as they complete."""

    def __init__(self) -> None:
        self._records: dict[str, list[Record]] = {}
        self._gaps: dict[str, array[int]] = {}

    def add(self, record: Record, gaps_ns: Iterable[int] = ()) -> None:
        self._records.setdefault(record.client_class, []).append(record)
        self._gaps.setdefault(record.client_class, array("q")).extend(gaps_ns)

    def build(self, wall_s: float) -> list[ClassSummary]:
        """One row per class seen, in the standard class order, then an ``all`` row."""
        order = [c for c in CLASS_NAMES if c in self._records]
        order += sorted(set(self._records) - set(order))
        rows = [self._row(c, self._records[c], self._gaps[c], wall_s) for c in order]
        if len(rows) > 1:
            every = [r for c in order for r in self._records[c]]
            gaps = array("q")
            for c in order:
                gaps.extend(self._gaps[c])
            rows.append(self._row("all", every, gaps, wall_s))
        return rows

    @staticmethod
    def _row(name: str, records: list[Record], gaps: array[int], wall_s: float) -> ClassSummary:
        tokens = sum(r.completion_tokens or 0 for r in records if r.status == "ok")
        return ClassSummary(
            client_class=name,
            requests=len(records),
            errors=sum(r.status != "ok" for r in records),
            ttft_ms=Percentiles.of(r.ttft_ms for r in records if r.ttft_ms is not None),
            itl_ms=Percentiles.of(g / NS_PER_MS for g in gaps),
            e2e_ms=Percentiles.of(r.e2e_ms for r in records if r.status == "ok"),
            completion_tokens=tokens,
            tokens_per_s=tokens / wall_s if wall_s > 0 else 0.0,
        )


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def render_table(rows: Sequence[ClassSummary]) -> str:
    """A plain-text table, one line per class (milliseconds; tokens/s)."""
    head = (
        "class", "n", "err",
        "ttft p50", "p95", "p99",
        "itl p50", "p95", "p99",
        "e2e p50", "p95",
        "tok/s",
    )  # fmt: skip
    lines = [head]
    for r in rows:
        lines.append(
            (
                r.client_class,
                str(r.requests),
                str(r.errors),
                _fmt(r.ttft_ms.p50),
                _fmt(r.ttft_ms.p95),
                _fmt(r.ttft_ms.p99),
                _fmt(r.itl_ms.p50),
                _fmt(r.itl_ms.p95),
                _fmt(r.itl_ms.p99),
                _fmt(r.e2e_ms.p50),
                _fmt(r.e2e_ms.p95),
                f"{r.tokens_per_s:.1f}",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = []
    for line in lines:
        cells = [line[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(line[1:], widths[1:], strict=True)
        ]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out) + "\n(latencies in ms, nearest-rank percentiles)"
