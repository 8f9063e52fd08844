"""Join the client's records with the sidecar's events by ``request_id``.

The report says which requests one side has and the other lacks, and how the
two views differ where both measured: TTFT and end-to-end time (client minus
sidecar: what the network and the client add, positive when all is well),
completion tokens, HTTP status. Events of other traffic in the same log (ids not
starting with one of the records' run ids) are counted and otherwise ignored.
:func:`check` is pure; :func:`check_files` reads the files, waiting a little for
events the sidecar has not written yet.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from obs.loadgen.confusion import Confusion, confusion
from obs.loadgen.records import read_jsonl
from obs.loadgen.summary import quantile

_EXAMPLES = 10


@dataclass(frozen=True, slots=True)
class Distribution:
    count: int
    mean: float
    p50: float
    p95: float
    p99: float
    min: float
    max: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Distribution | None:
        v = sorted(values)
        if not v:
            return None
        q = [quantile(v, p) or 0.0 for p in (0.5, 0.95, 0.99)]
        return cls(len(v), round(sum(v) / len(v), 3), q[0], q[1], q[2], v[0], v[-1])

    def render(self) -> str:
        return (
            f"n={self.count} mean {self.mean:g} p50 {self.p50:g} p95 {self.p95:g} "
            f"p99 {self.p99:g} min {self.min:g} max {self.max:g}"
        )


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One request where the two sides disagree on a value."""

    request_id: str
    client: Any
    sidecar: Any


@dataclass(frozen=True, slots=True)
class CheckReport:
    records: int
    events: int  # events of the records' runs
    other_events: int  # events of other traffic, ignored
    matched: int
    missing_in_events: tuple[str, ...]  # the client sent it; the sidecar logged nothing
    missing_in_records: tuple[str, ...]  # the sidecar logged this run's id; no client record
    duplicate_events: tuple[str, ...]  # ids the sidecar logged more than once
    ttft_diff_ms: Distribution | None  # client - sidecar, where both have a TTFT
    e2e_diff_ms: Distribution | None  # client - sidecar
    token_diff: Distribution | None  # client - sidecar completion tokens, where both have them
    token_mismatches: tuple[Mismatch, ...]
    status_mismatches: tuple[Mismatch, ...]  # HTTP status
    confusion: Confusion | None = None  # true class x lane (obs.loadgen.confusion)

    @property
    def ok(self) -> bool:
        """No request is missing from either side."""
        return not self.missing_in_events and not self.missing_in_records

    def to_dict(self) -> dict[str, Any]:
        out = {**asdict(self), "ok": self.ok}
        out["confusion"] = self.confusion.to_dict() if self.confusion else None
        return out

    def render(self) -> str:
        """A short plain-text report."""
        lines = [
            f"records {self.records}, sidecar events {self.events}"
            + (f" (+{self.other_events} of other traffic, ignored)" if self.other_events else "")
            + f", joined {self.matched}",
            _ids("missing from the sidecar's events", self.missing_in_events),
            _ids("missing from the client's records", self.missing_in_records),
        ]
        if self.duplicate_events:
            lines.append(_ids("logged more than once by the sidecar", self.duplicate_events))
        for label, dist in (
            ("TTFT client - sidecar (ms)", self.ttft_diff_ms),
            ("e2e client - sidecar (ms)", self.e2e_diff_ms),
            ("completion tokens client - sidecar", self.token_diff),
        ):
            lines.append(f"{label}: {dist.render() if dist else 'no pairs'}")
        for label, found in (
            ("completion tokens differ", self.token_mismatches),
            ("HTTP status differs", self.status_mismatches),
        ):
            shown = ", ".join(f"{m.request_id} ({m.client} vs {m.sidecar})" for m in found[:5])
            lines.append(f"{label}: {len(found)}" + (f"  e.g. {shown}" if shown else ""))
        if self.confusion is not None:
            lines += ["lanes the classes landed in (requests):", self.confusion.render()]
        lines.append("OK" if self.ok else "FAILED: requests missing")
        return "\n".join(lines)


def _ids(label: str, ids: tuple[str, ...]) -> str:
    shown = ", ".join(ids[:_EXAMPLES]) + (", ..." if len(ids) > _EXAMPLES else "")
    return f"{label}: {len(ids)}" + (f"  ({shown})" if ids else "")


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def check(records: Iterable[Mapping[str, Any]], events: Iterable[Mapping[str, Any]]) -> CheckReport:
    """Join records and events by ``request_id`` and compare them."""
    recs = {str(r.get("request_id")): r for r in records}
    prefixes = tuple({f"{r['run_id']}-" for r in recs.values() if r.get("run_id")})
    counts: Counter[str] = Counter()
    evs: dict[str, Mapping[str, Any]] = {}
    other = 0
    for e in events:
        rid = str(e.get("request_id"))
        if rid in recs or (prefixes and rid.startswith(prefixes)):
            counts[rid] += 1
            evs.setdefault(rid, e)
        else:
            other += 1
    joined = [(rid, recs[rid], evs[rid]) for rid in recs if rid in evs]

    def diffs(key: str) -> list[float]:
        out = []
        for _, r, e in joined:
            a, b = _num(r.get(key)), _num(e.get(key))
            if a is not None and b is not None:
                out.append(round(a - b, 3))
        return out

    tokens = [
        Mismatch(rid, r.get("completion_tokens"), e.get("completion_tokens"))
        for rid, r, e in joined
        if _num(r.get("completion_tokens")) is not None
        and _num(e.get("completion_tokens")) is not None
        and r.get("completion_tokens") != e.get("completion_tokens")
    ]
    statuses = [
        Mismatch(rid, r.get("http_status"), e.get("http_status"))
        for rid, r, e in joined
        if r.get("http_status") is not None
        and e.get("http_status") is not None
        and r.get("http_status") != e.get("http_status")
    ]
    return CheckReport(
        records=len(recs),
        events=sum(counts.values()),
        other_events=other,
        matched=len(joined),
        missing_in_events=tuple(rid for rid in recs if rid not in evs),
        missing_in_records=tuple(sorted(rid for rid in evs if rid not in recs)),
        duplicate_events=tuple(sorted(rid for rid, n in counts.items() if n > 1)),
        ttft_diff_ms=Distribution.of(diffs("ttft_ms")),
        e2e_diff_ms=Distribution.of(diffs("e2e_ms")),
        token_diff=Distribution.of(diffs("completion_tokens")),
        token_mismatches=tuple(tokens),
        status_mismatches=tuple(statuses),
        confusion=confusion((r, e) for _, r, e in joined),
    )


def check_files(
    records_path: str | Path,
    events_path: str | Path,
    *,
    wait_s: float = 0.0,
    poll_s: float = 0.25,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> CheckReport:
    """:func:`check` on two JSONL files; rereads the events up to ``wait_s`` until complete."""
    records = list(read_jsonl(records_path))
    deadline = clock() + wait_s
    while True:
        if Path(events_path).exists() or clock() >= deadline:
            report = check(records, read_jsonl(events_path))
            if not report.missing_in_events or clock() >= deadline:
                return report
        sleep(poll_s)
