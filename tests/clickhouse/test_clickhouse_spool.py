"""The exporter's bounded spool file: what fits is kept, sent in order, and survives restarts."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from obs.exporters.spool import Spool


def _lines(n: int, width: int = 10) -> list[bytes]:
    return [f"{i:0{width - 1}d}\n".encode() for i in range(n)]


def test_append_keeps_what_fits_and_reports_it(tmp_path: Path) -> None:
    """Lines past max_bytes are refused (the caller counts them dropped); the rest are kept."""
    spool = Spool(tmp_path / "s.jsonl", max_bytes=35)
    assert spool.append(_lines(5)) == 3
    assert spool.pending_bytes == 30
    assert spool.append(_lines(1)) == 0
    assert (tmp_path / "s.jsonl").stat().st_mode & 0o777 == 0o600


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(n=st.integers(1, 200), chunk=st.integers(10, 400))
def test_peek_and_consume_deliver_every_line_once_in_order(
    tmp_path_factory: pytest.TempPathFactory, n: int, chunk: int
) -> None:
    """Draining in chunks of whole lines yields every spooled line once, oldest first."""
    path = tmp_path_factory.mktemp("spool") / "s.jsonl"
    spool = Spool(path, max_bytes=1 << 20)
    lines = _lines(n)
    spool.append(lines)
    got: list[bytes] = []
    while spool:
        data, count = spool.peek(chunk)
        assert data.endswith(b"\n") and data.count(b"\n") == count > 0
        got.extend(data.splitlines(keepends=True))
        spool.consume(len(data))
    assert got == lines
    assert path.stat().st_size == 0


def test_reopened_spool_resends_and_drops_a_cut_line(tmp_path: Path) -> None:
    """A spool left by a dead process is sent from its start; a half-written last line is cut."""
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"".join(_lines(3)) + b'{"half": ')
    spool = Spool(path, max_bytes=1 << 20)
    assert spool.pending_bytes == 30
    data, count = spool.peek(1 << 20)
    assert (data, count) == (b"".join(_lines(3)), 3)
