"""``query compare`` and its tests of noise: Mann-Whitney U and two proportions."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from obs.config import default_config_path, load_config
from obs.errors import InputError
from obs.query.comparison import compare
from obs.query.filters import Filters
from obs.query.scan import Scan, connect
from obs.query.stats import mann_whitney, two_proportions
from obs.query.testing import event, mixed_events, ts, write_jsonl

pytestmark = pytest.mark.inproc

CONFIG = load_config(default_config_path())


def naive_mann_whitney(before: list[float], after: list[float]) -> tuple[float, float]:
    """U of ``before`` by counting pairs, and the tie-corrected normal p-value."""
    u = sum((x > y) + 0.5 * (x == y) for x in before for y in after)
    n1, n2 = len(before), len(after)
    n = n1 + n2
    ties = sum(t**3 - t for t in Counter(before + after).values())
    sigma = math.sqrt(n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))))
    z = max(0.0, abs(u - n1 * n2 / 2) - 0.5) / sigma
    return u, math.erfc(z / math.sqrt(2))


def test_mann_whitney_matches_pair_counting_with_ties():
    """U and p from rank sums equal the pair-counting definition, ties included."""
    before = [3.0, 5.0, 5.0, 7.0, 9.0, 9.0, 9.0, 12.0]
    after = [5.0, 9.0, 10.0, 11.0, 12.0, 14.0, 15.0]
    pooled = sorted(before + after)
    mid = {v: (pooled.index(v) + 1 + pooled.index(v) + pooled.count(v)) / 2 for v in pooled}
    r1 = sum(mid[v] for v in before)
    ties = sum(t**3 - t for t in Counter(pooled).values())
    got = mann_whitney(len(before), len(after), r1, ties)
    u, p = naive_mann_whitney(before, after)
    assert got is not None
    assert got.u == pytest.approx(u)
    assert got.p_value == pytest.approx(p)
    assert got.prob_after_greater == pytest.approx(1 - u / (len(before) * len(after)))


def test_mann_whitney_known_value_for_separated_samples():
    """Five vs five fully separated samples give p = 0.0122 (normal approx, continuity)."""
    got = mann_whitney(5, 5, 15.0, 0.0)
    assert got is not None and got.p_value == pytest.approx(0.01219, abs=1e-4)
    assert mann_whitney(0, 5, 0.0, 0.0) is None


def test_two_proportions_matches_the_pooled_z_test():
    """The pooled two-proportion z-test p-value, by the textbook formula."""
    x1, n1, x2, n2 = 12, 400, 31, 420
    p = (x1 + x2) / (n1 + n2)
    z = (x2 / n2 - x1 / n1) / math.sqrt(p * (1 - p) * (1 / n1 + 1 / n2))
    assert two_proportions(x1, n1, x2, n2) == pytest.approx(math.erfc(abs(z) / math.sqrt(2)))
    assert two_proportions(0, 10, 0, 10) == 1.0
    assert two_proportions(1, 0, 1, 5) is None


def scans(paths_a: list[str], fa: Filters, paths_b: list[str], fb: Filters) -> tuple[Scan, Scan]:
    con = connect()
    return Scan(paths_a, fa, con=con), Scan(paths_b, fb, con=con)


def test_compare_two_windows_matches_direct_computation(tmp_path: Path):
    """Before/after values, deltas and p-values per lane equal plain-Python computations."""
    # Alternate events between two windows so every lane has requests in both.
    events = [
        replace(e, ts=ts(5 * i + (0 if i % 2 else 600))) for i, e in enumerate(mixed_events())
    ]
    path = str(write_jsonl(tmp_path / "e.jsonl", events))
    cut = "2025-06-02T12:08:00"
    fb = Filters.parse(until=cut)
    fa = Filters.parse(since=cut)
    before, after = scans([path], fb, [path], fa)
    got = {(r["lane"], r["metric"]): r for r in compare(before, after, CONFIG).records()}
    early = [e for e in events if e.ts < "2025-06-02T12:08:00"]
    late = [e for e in events if e.ts >= "2025-06-02T12:08:00"]
    for lane in ("chat", "rag", "batch"):
        b = [e for e in early if e.lane == lane]
        a = [e for e in late if e.lane == lane]
        row = got[(lane, "requests")]
        assert (row["before"], row["after"], row["delta"]) == (len(b), len(a), len(a) - len(b))
        xb = sum(e.status == "error" for e in b)
        xa = sum(e.status == "error" for e in a)
        row = got[(lane, "error_rate")]
        assert row["before"] == pytest.approx(xb / len(b))
        assert row["after"] == pytest.approx(xa / len(a))
        assert row["p_value"] == pytest.approx(two_proportions(xb, len(b), xa, len(a)))
        tb = [e.ttft_ms for e in b if e.status == "ok" and e.ttft_ms is not None]
        ta = [e.ttft_ms for e in a if e.status == "ok" and e.ttft_ms is not None]
        if tb and ta:
            _, p = naive_mann_whitney(tb, ta)
            row = got[(lane, "ttft_p50_ms")]
            assert row["test"] == "mann-whitney"
            assert row["p_value"] == pytest.approx(p)
            assert row["significant"] is (p < 0.01)


def test_compare_flags_a_real_shift_and_not_noise(tmp_path: Path):
    """A tripled TTFT is significant; the same distribution again is not."""
    base = [event(lane="chat", ts=ts(i), prefill_ms=100.0 + (i * 37) % 90) for i in range(60)]
    same = [event(lane="chat", ts=ts(i), prefill_ms=100.0 + (i * 53) % 90) for i in range(60)]
    slow = [event(lane="chat", ts=ts(i), prefill_ms=300.0 + (i * 37) % 270) for i in range(60)]
    a = str(write_jsonl(tmp_path / "a.jsonl", base))
    b = str(write_jsonl(tmp_path / "b.jsonl", same))
    c = str(write_jsonl(tmp_path / "c.jsonl", slow))

    def verdict(other: str) -> dict[str, Any]:
        rows = compare(*scans([a], Filters(), [other], Filters()), CONFIG).records()
        return next(r for r in rows if r["metric"] == "ttft_p95_ms")

    shifted = verdict(c)
    assert shifted["significant"] is True and shifted["delta"] > 0
    assert verdict(b)["significant"] is False


def test_lane_missing_on_one_side_counts_zero_requests(tmp_path: Path):
    """A lane present only before shows 0 requests after, and no test."""
    a = str(write_jsonl(tmp_path / "a.jsonl", [event(lane="chat"), event(lane="rag")]))
    b = str(write_jsonl(tmp_path / "b.jsonl", [event(lane="chat")]))
    rows = compare(*scans([a], Filters(), [b], Filters()), CONFIG).records()
    rag = {r["metric"]: r for r in rows if r["lane"] == "rag"}
    assert (rag["requests"]["before"], rag["requests"]["after"]) == (1, 0)
    assert rag["error_rate"]["after"] is None and rag["error_rate"]["p_value"] is None


def test_compare_requires_a_shared_connection(tmp_path: Path):
    """Scans on different connections cannot be compared (the rank test joins them)."""
    path = str(write_jsonl(tmp_path / "e.jsonl", mixed_events()))
    with pytest.raises(InputError, match="connection"):
        compare(Scan([path]), Scan([path]), CONFIG)
