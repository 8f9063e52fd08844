"""The end-of-run summary table per class and the terminal progress line."""

from __future__ import annotations

import io

from obs.loadgen.progress import Progress, render
from obs.loadgen.records import Record
from obs.loadgen.summary import Percentiles, SummaryBuilder, quantile, render_table


def _rec(cls: str, ttft: float | None, tokens: int, status: str = "ok") -> Record:
    return Record(
        client_class=cls, ttft_ms=ttft, e2e_ms=(ttft or 0) + 100, completion_tokens=tokens,
        status=status,
    )  # fmt: skip


def test_quantile_is_nearest_rank() -> None:
    """quantile() picks the nearest-rank element, None for no data."""
    v = [float(i) for i in range(1, 11)]
    assert (quantile(v, 0.5), quantile(v, 0.95), quantile(v, 0.99)) == (5.0, 10.0, 10.0)
    assert quantile([], 0.5) is None


def test_summary_rows_per_class_pool_itl_gaps() -> None:
    """Rows come in class order with counts, errors, percentiles, pooled ITL and tokens/s."""
    b = SummaryBuilder()
    b.add(_rec("rag", 200.0, 30), [5_000_000, 7_000_000])
    for i in range(1, 101):
        b.add(_rec("chat", float(i), 10), [i * 1_000_000])
    b.add(_rec("chat", None, 0, status="error"))
    rows = b.build(wall_s=10.0)
    assert [r.client_class for r in rows] == ["chat", "rag", "all"]
    chat = rows[0]
    assert (chat.requests, chat.errors, chat.completion_tokens) == (101, 1, 1000)
    assert chat.ttft_ms == Percentiles(50.0, 95.0, 99.0)
    assert chat.itl_ms == Percentiles(50.0, 95.0, 99.0)
    assert chat.tokens_per_s == 100.0
    assert rows[1].itl_ms == Percentiles(5.0, 7.0, 7.0)
    assert rows[2].requests == 102 and rows[2].completion_tokens == 1030


def test_table_has_a_header_and_a_line_per_row() -> None:
    """The rendered table has the column header, one line per class and a units note."""
    b = SummaryBuilder()
    b.add(_rec("chat", 12.5, 10), [1_000_000])
    lines = render_table(b.build(wall_s=1.0)).splitlines()
    assert lines[0].split() == [
        "class", "n", "err", "ttft", "p50", "p95", "p99", "itl", "p50", "p95", "p99",
        "e2e", "p50", "p95", "tok/s",
    ]  # fmt: skip
    assert lines[1].split()[:4] == ["chat", "1", "0", "12.5"] and "ms" in lines[-1]


def test_progress_line_uses_the_tighter_bound() -> None:
    """The bar fills by request count or elapsed time, whichever is further along."""
    assert render(5, 0, 2, 1.0, total=10, duration_s=100.0).startswith("[" + "#" * 12 + ".")
    assert render(1, 0, 0, 50.0, total=10, duration_s=100.0).startswith("[" + "#" * 12 + ".")
    line = render(3, 1, 2, 4.0, total=None, duration_s=None)
    assert "3 req  1 err  2 in flight  4s" in line


def test_progress_is_silent_when_disabled_and_throttled_when_enabled() -> None:
    """Disabled progress writes nothing; enabled redraws at most once per interval."""
    out = io.StringIO()
    Progress(out, total=5, duration_s=None, enabled=False).update(1, 0, 0)
    assert out.getvalue() == ""
    now = [0.0]
    p = Progress(out, total=5, duration_s=None, enabled=True, clock=lambda: now[0])
    p.update(1, 0, 0)
    p.update(2, 0, 0)
    now[0] = 1.0
    p.update(3, 0, 0)
    p.close()
    assert out.getvalue().count("\r") == 2 and "3/5 req" in out.getvalue()
    assert out.getvalue().endswith("\n")
