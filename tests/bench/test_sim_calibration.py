"""The simulator's calibration (bench/sim_calibration.py): its committed result file and the
table in docs/sim.md are what the calibration computes now."""

from __future__ import annotations

import json
from pathlib import Path

from bench import sim_calibration

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "bench" / "results" / "sim_calibration.json"
DOC = ROOT / "docs" / "sim.md"


def test_the_committed_result_is_what_the_calibration_computes() -> None:
    """Rerunning the calibration (virtual time, seeded) gives the committed file's rows, so a
    change to the model that moves a figure must come with the regenerated file."""
    committed = json.loads(RESULT.read_text(encoding="utf-8"))
    assert json.loads(json.dumps(sim_calibration.table())) == committed


def test_the_docs_table_shows_the_committed_figures() -> None:
    """Each row of docs/sim.md's calibration table carries its result row's simulated
    throughput, mean TTFT and verdict."""
    rows = json.loads(RESULT.read_text(encoding="utf-8"))
    lines = [ln for ln in DOC.read_text(encoding="utf-8").splitlines() if ln.startswith("| ")]
    table = [ln.split(" | ") for ln in lines if " in / " in ln and " out, " in ln]
    assert len(table) == len(rows)
    for cells, row in zip(table, rows, strict=True):
        assert cells[4] == str(row["sim_output_tok_s"])
        assert cells[7] == str(row["sim_ttft_ms"])
        assert cells[9] == ("yes" if row["within_25pct"] else "no")
