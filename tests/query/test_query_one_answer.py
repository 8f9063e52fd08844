"""One answer: `query show`, `query incident` and `query budget` name the same phase and cause
for the same miss over the same window (``obs.query.error_budget.causes``: the sidecar's stamp,
what the burn-rate alerts count, where the event carries one; the rule otherwise)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from obs.cli import main
from obs.query.testing import event, ts, write_jsonl

pytestmark = pytest.mark.inproc  # DuckDB's scan runs a thread

ROOT = Path(__file__).resolve().parents[2]
LOG = str(ROOT / "tests" / "data" / "demo-sim-events.jsonl")  # the real sidecar's, sim demo
CONFIG = str(ROOT / "obs" / "data" / "lanes.yaml")


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    assert main(["query", *args, "--no-progress", "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def _stamped() -> dict[tuple[str, str], Counter[str]]:
    """Per lane and first missed gate: the causes the sidecar stamped on the log's events."""
    out: dict[tuple[str, str], Counter[str]] = {}
    with open(LOG, encoding="utf-8") as f:
        for line in f:
            ev = json.loads(line)
            if ev["miss_cause"]:
                key = (ev["lane"], ev["miss_slo"].split(",")[0])
                out.setdefault(key, Counter())[ev["miss_cause"]] += 1
    return out


def test_show_incident_and_budget_name_the_same_cause(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """On the sim demo's log (its burst of rag prompts): each worst miss budget lists has the
    phase and cause `show` prints for it; each lane's misses of a gate the sidecar stamped
    split by cause as the stamps do; each lane's cause in `incident` is budget's top one; the
    incident's cause is the one behind most of its victims' misses in budget, its trigger rag."""
    doc = _json(capsys, "budget", LOG, "--config", CONFIG)
    draft = _json(capsys, "incident", LOG, "--config", CONFIG)
    stamped = _stamped()
    checked = 0
    for e in doc["slos"]:
        for w in e["worst"]:
            ev = _json(capsys, "show", w["request_id"], LOG)["event"]
            if ev["miss_slo"].split(",")[0] == e["slo"]:
                assert (w["phase"], w["cause"]) == (ev["miss_phase"], ev["miss_cause"]), w
                checked += 1
        mine = stamped.get((e["lane"], e["slo"]), Counter())
        if mine and mine.total() == e["misses"]:  # every miss of it is a stamped first gate
            assert {r["cause"]: r["misses"] for r in e["by_cause"]} == dict(mine), e
    assert checked >= 10
    tops = {
        (e["lane"], e["slo"]): e["by_phase_cause"][0]["cause"] for e in doc["slos"] if e["misses"]
    }
    assert {(s["lane"], s["slo"]): s["cause"] for s in draft["slos"]} == tops
    (inc,) = draft["incidents"]
    assert inc["trigger"]["lane"] == "rag" and "budget_cause" not in inc
    victims = {v["lane"] for v in inc["victims"]}
    behind: Counter[str] = Counter()
    for e in doc["slos"]:
        if e["lane"] in victims:
            behind.update({r["cause"]: r["misses"] for r in e["by_cause"]})
    ((top, n), (_, second)) = behind.most_common(2)
    assert n > second and inc["cause"] == top == "engine_queue"


SLO = {
    "ttft": {"threshold_ms": 300, "objective": 0.9},
    "tpot": {"threshold_ms": 50, "objective": 0.9},
}
LANES = {"version": 1, "pools": [{"name": "p", "replicas": ["http://r1"]}],
         "lanes": [{"name": "chat", "pool": "p", "slo": SLO}], "default_lane": "chat"}  # fmt: skip


def test_the_stamp_answers_for_its_gate_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A request that missed TTFT and TPOT, stamped for TTFT: budget charges TTFT to the
    stamped phase and cause and TPOT by the rule (decode, against the window's baseline); a
    stamped cause no rule knows is ignored for the rule's."""
    good = [
        event(ts=ts(i), lane="chat", queue_ms=2.0, prefill_ms=40.0, decode_ms=200.0,
              tpot_ms=10.0, completion_tokens=21)
        for i in range(20)
    ]  # fmt: skip
    both = event(ts=ts(30), lane="chat", request_id="both", queue_ms=900.0, prefill_ms=40.0,
                 decode_ms=4000.0, tpot_ms=200.0, completion_tokens=21, miss_slo="ttft,tpot",
                 miss_phase="queue", miss_cause="engine_queue")  # fmt: skip
    odd = event(ts=ts(31), lane="chat", request_id="odd", queue_ms=2.0, prefill_ms=900.0,
                decode_ms=200.0, tpot_ms=10.0, completion_tokens=21, miss_slo="ttft",
                miss_phase="warp", miss_cause="gremlins")  # fmt: skip
    log = str(write_jsonl(tmp_path / "events.jsonl", [*good, both, odd]))
    config = tmp_path / "lanes.yaml"
    config.write_text(yaml.safe_dump(LANES), encoding="utf-8")
    doc = _json(capsys, "budget", log, "--config", str(config))
    charged = {
        (e["slo"], w["request_id"]): (w["phase"], w["cause"])
        for e in doc["slos"]
        for w in e["worst"]
    }
    assert charged[("ttft", "both")] == ("queue", "engine_queue")
    assert charged[("tpot", "both")] == ("decode", "other")
    assert charged[("ttft", "odd")] == ("prefill", "other")
