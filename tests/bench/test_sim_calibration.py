"""The simulator's calibration (bench/sim_calibration.py): fit and held-out points kept apart,
the committed result file and docs/sim.md's table are what the calibration computes now."""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from bench import sim_calibration as cal
from bench.sim_calibration_cases import FIT, ROUND3, WMX_C1_TTFT_P50
from bench.sim_calibration_points import HELD_OUT, LATER
from bench.sim_calibration_replay import output_lengths
from obs.engines.sim.hardware import CALIBRATION

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "bench" / "results" / "sim_calibration.json"
SEEN = FIT + ROUND3 + LATER  # every fit point
DOC = ROOT / "docs" / "sim.md"


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_the_committed_result_is_what_its_calibration_computes() -> None:
    """Rerunning the calibration (virtual time, seeded) with the file's calibration gives the
    file's points and summary, so a model change must come with a regenerated file."""
    doc = _load(RESULT)
    rows = cal.table(CALIBRATION.__class__(**doc["calibration"]))
    assert json.loads(json.dumps(rows)) == doc["points"]
    assert cal.summary(rows) == doc["summary"]


def test_the_committed_calibration_is_the_models_default() -> None:
    """The committed result scores the calibration the simulator runs with."""
    assert CALIBRATION.__class__(**_load(RESULT)["calibration"]) == CALIBRATION


def test_the_held_out_points_are_kept_apart_from_the_fit() -> None:
    """The held-out points are exactly the registered list, none of them a fit point; the
    fit reads only fit points; the summary's bar verdict follows from its own counts."""
    assert [c for c in cal.CASES if c.held_out] == list(HELD_OUT)
    assert not any(c.held_out for c in SEEN)
    assert {c.name for c in SEEN}.isdisjoint(c.name for c in HELD_OUT)
    assert cal.loss(CALIBRATION, cal.CASES[: len(SEEN)]) == cal.loss(CALIBRATION, SEEN)
    s = _load(RESULT)["summary"]
    h = s["held_out"]
    assert h["points"] == sum(len(c.published) for c in HELD_OUT)
    assert s["fit"]["points"] == sum(len(c.published) for c in SEEN)
    bars = (
        h["points"] >= 8
        and h["sources"] >= 3
        and h["h100_points"] >= 2
        and h["ttft_points"] >= 1
        and (h["median_error"] or 0.0) <= cal.MEDIAN_LIMIT
        and (h["max_error"] or 0.0) <= cal.LIMIT
    )
    assert s["bars_met"] is bars
    outside = sum(len(c.published) for c in HELD_OUT if c.outside_domain)
    assert s["held_out_in_domain"]["points"] == h["points"] - outside


def test_answer_lengths_end_at_the_cap_or_earlier_at_the_published_mean() -> None:
    """Without --ignore-eos an answer never passes max_tokens and the lengths average the
    published mean; with it (no mean) every answer is max_tokens long."""
    draw = output_lengths(128, 100.25, random.Random(1))
    lengths = [draw() for _ in range(20_000)]
    assert max(lengths) == 128 and min(lengths) >= 1
    assert abs(statistics.mean(lengths) - 100.25) < 1.0
    fixed = output_lengths(128, 0.0, random.Random(1))
    assert {fixed() for _ in range(10)} == {128}


def test_the_docs_table_is_the_committed_points() -> None:
    """Each row of docs/sim.md's calibration table is the committed point's set, published
    and simulated figure and ratio."""
    rows = _load(RESULT)["points"]
    points = [ln for ln in cal.markdown(rows) if ln.startswith("| `")]
    marks = (" | fit | ", " | held out | ")
    lines = [
        ln
        for ln in DOC.read_text(encoding="utf-8").splitlines()
        if ln.startswith("| `") and any(m in ln for m in marks)
    ]
    assert len(points) == len(rows) and lines == points


def test_a_declared_host_floor_gives_back_the_hosts_own_concurrency_1_ttft() -> None:
    """A source whose table has a concurrency-1 TTFT (the L4 sweep's 27 ms) declares its
    host's per-request floor from it: the model at concurrency 1 with that floor gives the
    published figure; a source without one keeps the fitted floor (None)."""
    l4 = next(c for c in SEEN if c.name == "l4-qwen0.5b-c8")
    floor = cal.host_floor(l4)
    assert floor is not None and floor > 0
    c1 = replace(l4, concurrency=1, prompts=20, host_c1_ttft_ms=0.0)
    assert cal.simulate(c1, floor_s=floor)["ttft_p50_ms"] == pytest.approx(WMX_C1_TTFT_P50)
    assert cal.host_floor(FIT[0]) is None
