"""The collector's cost benchmark against a real sidecar process: what it reads, and that a
short stream's objects are freed by reference counting, not left to the cycle collector."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import collector_cost


@pytest.mark.process
def test_a_sidecar_process_leaves_its_short_streams_to_reference_counting(tmp_path: Path) -> None:
    """1,500 short streams at 64 streams (every exporter on): the hook saw the run, and the
    collector freed well under one object a request (cycles per request would be ~30)."""
    out = tmp_path / "runs.json"
    assert collector_cost.main(["--requests", "1500", "--rounds", "1", "--out", str(out)]) == 0
    (run,) = json.loads(out.read_text())
    assert run["target"] == "sidecar" and run["requests"] == 1500
    assert run["cpu_ms_per_request"] > 0
    assert run["freed_per_request"] < 1.0, run


def test_a_bad_extra_sidecar_is_one_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """--extra-sidecar without an obs tree at PATH stops with argparse's usage error."""
    with pytest.raises(SystemExit) as exc:
        collector_cost.main(["--extra-sidecar", "before=/nonexistent"])
    assert exc.value.code == 2
    assert "NAME=PATH, with an obs package under PATH" in capsys.readouterr().err
