"""The confusion matrix of a load run: each request's true class against the lane it got.

The load generator knows each request's class; the sidecar's event says which lane took it.
Joined by ``request_id`` (:mod:`obs.loadgen.check`), they give one row per class and one
column per lane, and each class's share in the lane of its own name (the shipped lanes are
named after the classes). A slow reader can only be recognised by how it read an earlier
stream, so with simulated clients (``vllm-obs load --clients``) each slow-stream client's
first request has its own row, ``slow-stream (first)``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from obs.loadgen.mix import CLASS_NAMES

LEARNED_CLASSES = ("slow-stream",)  # recognised from behaviour: first requests apart
FIRST = " (first)"


@dataclass(frozen=True, slots=True)
class Confusion:
    lanes: tuple[str, ...]
    rows: tuple[tuple[str, tuple[int, ...]], ...]  # (class, requests per lane)

    def own_share(self, label: str) -> float | None:
        """The share of the row's requests in the lane named after its class."""
        counts = dict(self.rows)[label]
        total = sum(counts)
        name = label.removesuffix(FIRST)
        if not total or name not in self.lanes:
            return None
        return counts[self.lanes.index(name)] / total

    def to_dict(self) -> dict[str, Any]:
        return {
            "lanes": list(self.lanes),
            "rows": {label: dict(zip(self.lanes, n, strict=True)) for label, n in self.rows},
            "own_lane_share": {label: self.own_share(label) for label, _ in self.rows},
        }

    def render(self) -> str:
        """A Markdown table: classes down, lanes across, and the share in the own lane."""
        head = ["true class \\ lane", *self.lanes, "in own lane"]
        lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
        for label, counts in self.rows:
            share = self.own_share(label)
            pct = "-" if share is None else f"{100 * share:.1f}%"
            lines.append("| " + " | ".join([label, *map(str, counts), pct]) + " |")
        return "\n".join(lines)


def _label(rec: Mapping[str, Any], first: set[str]) -> str:
    cls = str(rec.get("client_class") or "?")
    return cls + FIRST if str(rec.get("request_id")) in first else cls


def _firsts(records: list[Mapping[str, Any]]) -> set[str]:
    """Request ids of each simulated client's first request, for the learned classes."""
    seen: dict[str, Mapping[str, Any]] = {}
    for r in records:
        who = r.get("client")
        if who is None or r.get("client_class") not in LEARNED_CLASSES:
            continue
        if who not in seen or float(r.get("offset_s") or 0) < float(seen[who].get("offset_s") or 0):
            seen[who] = r
    return {str(r.get("request_id")) for r in seen.values()}


def confusion(pairs: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> Confusion | None:
    """The matrix over (record, event) pairs of one run; None when none has a lane."""
    joined = [(r, e) for r, e in pairs if e.get("lane")]
    if not joined:
        return None
    first = _firsts([r for r, _ in joined])
    cells: Counter[tuple[str, str]] = Counter((_label(r, first), str(e["lane"])) for r, e in joined)
    seen_lanes = {lane for _, lane in cells}
    lanes = [n for n in CLASS_NAMES if n in seen_lanes] + sorted(seen_lanes - set(CLASS_NAMES))
    labels = {label for label, _ in cells}
    order = [x for n in CLASS_NAMES for x in (n, n + FIRST) if x in labels]
    order += sorted(labels - set(order))
    rows = tuple((label, tuple(cells[label, lane] for lane in lanes)) for label in order)
    return Confusion(tuple(lanes), rows)
