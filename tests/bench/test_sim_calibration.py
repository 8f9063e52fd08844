"""The simulator's calibration (bench/sim_calibration.py): fit and held-out points kept apart,
the committed result files and docs/sim.md's table are what the calibration computes now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import sim_calibration as cal
from obs.engines.sim.hardware import CALIBRATION

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "bench" / "results" / "sim_calibration.json"
ROUND1 = ROOT / "bench" / "results" / "sim_calibration_round1.json"
DOC = ROOT / "docs" / "sim.md"


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", [RESULT, ROUND1], ids=["committed", "round1"])
def test_each_committed_result_is_what_its_calibration_computes(path: Path) -> None:
    """Rerunning the calibration (virtual time, seeded) with the file's calibration gives the
    file's points and summary, so a model change must come with regenerated files."""
    doc = _load(path)
    rows = cal.table(CALIBRATION.__class__(**doc["calibration"]))
    assert json.loads(json.dumps(rows)) == doc["points"]
    assert cal.summary(rows) == doc["summary"]


def test_the_committed_calibration_is_the_models_default() -> None:
    """The committed result scores the calibration the simulator runs with."""
    assert CALIBRATION.__class__(**_load(RESULT)["calibration"]) == CALIBRATION


def test_held_out_points_are_many_independent_and_none_is_fitted() -> None:
    """The held-out set has at least 8 points from at least 3 sources, 2 of them on H100,
    a TTFT among them; the fit reads only fit points (its loss ignores held-out ones)."""
    s = _load(RESULT)["summary"]["held_out"]
    assert s["points"] >= 8 and s["sources"] >= 3 and s["h100_points"] >= 2
    assert s["ttft_points"] >= 1
    fit_only = [c for c in cal.CASES if not c.held_out]
    assert cal.loss(CALIBRATION, cal.CASES[: len(fit_only)]) == cal.loss(CALIBRATION, fit_only)
    every = {r["point"] for r in _load(RESULT)["points"]}
    assert len(every) == sum(len(c.published) for c in cal.CASES)


def test_the_docs_table_shows_both_rounds_figures() -> None:
    """Each row of docs/sim.md's calibration table is the committed point's set, published
    and simulated figure and ratio, beside round 1's."""
    rows, round1 = _load(RESULT)["points"], _load(ROUND1)["points"]
    expected = cal.markdown(rows, round1)
    points = [ln for ln in expected if ln.startswith("| `")]
    marks = (" | fit | ", " | held out | ")
    lines = [
        ln
        for ln in DOC.read_text(encoding="utf-8").splitlines()
        if ln.startswith("| `") and any(m in ln for m in marks)
    ]
    assert len(points) == len(rows) and lines == points
