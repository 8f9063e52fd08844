"""The committed rule and promtool test files: up to date, and every alert tested both ways."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from obs.alerts.model import build_model
from obs.alerts.promtool_tests import promtool_files
from obs.alerts.rules import rule_files
from obs.alerts.writer import write
from obs.config import default_config_path, load_config
from obs.durations import seconds
from tests.support.promql_names import metric_names

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "deploy" / "prometheus" / "rules"
TESTS_DIR = ROOT / "tests" / "promtool"
REGENERATE = ".venv/bin/vllm-obs alerts --out deploy/prometheus/rules --tests tests/promtool"


def _load(directory: Path, pattern: str) -> dict[str, Any]:
    return {p.name: yaml.safe_load(p.read_text(encoding="utf-8")) for p in directory.glob(pattern)}


@pytest.mark.parametrize(
    ("committed", "sub", "pattern"),
    [(RULES_DIR, "deploy/prometheus/rules", "*.rules.yml"), (TESTS_DIR, "tests/promtool", "*.yml")],
)
def test_committed_files_match_a_fresh_generation(
    tmp_path: Path, committed: Path, sub: str, pattern: str
) -> None:
    """Regenerating from the shipped config changes no committed file (else: run the CLI)."""
    model = build_model(load_config(default_config_path()))
    files = rule_files(model)
    rules_out, tests_out = tmp_path / "deploy/prometheus/rules", tmp_path / "tests/promtool"
    write(rules_out, files, default_config_path().name)
    write(tests_out, promtool_files(model, files, rules_out, tests_out), default_config_path().name)
    fresh = tmp_path / sub
    want = {p.name: p.read_text(encoding="utf-8") for p in fresh.glob(pattern)}
    have = {p.name: p.read_text(encoding="utf-8") for p in committed.glob(pattern)}
    assert sorted(have) == sorted(want), f"file set differs; regenerate: {REGENERATE}"
    stale = [name for name in want if have[name] != want[name]]
    assert not stale, f"{stale} out of date; regenerate: {REGENERATE}"


def _inputs_read_by(rule: dict[str, Any], records: dict[str, set[str]]) -> set[str]:
    """Raw metric names a rule reads, through the recording rules it uses."""
    out: set[str] = set()
    todo = list(metric_names(rule["expr"]))
    while todo:
        name = todo.pop()
        if name in records:
            todo += records[name]
        else:
            out.add(name)
    return out


def _matches(rule: dict[str, Any], exp: dict[str, Any]) -> bool:
    return rule["labels"].items() <= exp["exp_labels"].items()


def _touches(group: dict[str, Any], rule: dict[str, Any], reads: set[str]) -> bool:
    """The group feeds the rule: a series it reads, with the rule's lane/pool labels."""
    scope = [f'{k}="{rule["labels"][k]}"' for k in ("lane", "pool") if k in rule["labels"]]
    for s in group["input_series"]:
        name = s["series"].split("{", 1)[0]
        if name in reads and any(x in s["series"] for x in scope or [""]):
            return True
    return False


def test_every_alert_rule_has_pending_firing_and_silent_cases() -> None:
    """Each alerting rule pends for its `for`, then fires in one case, and is silent in another."""
    rules_files = _load(RULES_DIR, "*.rules.yml")
    tests: dict[str, dict[str, Any]] = {}  # rule file -> every group of its test files
    for doc in _load(TESTS_DIR, "*.test.yml").values():
        (rule_file,) = doc["rule_files"]
        tests.setdefault(Path(rule_file).name, {"tests": []})["tests"] += doc["tests"]
    assert sorted(tests) == sorted(rules_files)
    for test_name, doc in tests.items():
        groups = rules_files[test_name]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        records: dict[str, set[str]] = {}
        for r in rules:
            if "record" in r:
                records.setdefault(r["record"], set()).update(metric_names(r["expr"]))
        for rule in (r for r in rules if "alert" in r):
            reads = _inputs_read_by(rule, records)
            fired = pending = silent = False
            for group in doc["tests"]:
                checks = [t for t in group["alert_rule_test"] if t["alertname"] == rule["alert"]]
                fire_times = [
                    seconds(t["eval_time"])
                    for t in checks
                    if any(_matches(rule, e) for e in t["exp_alerts"])
                ]
                quiet = [t for t in checks if not any(_matches(rule, e) for e in t["exp_alerts"])]
                if fire_times:
                    fired = True
                    first = min(fire_times)
                    pending |= seconds(rule["for"]) == 0 or any(
                        seconds(t["eval_time"]) < first for t in quiet
                    )
                elif quiet and _touches(group, rule, reads):
                    silent = True
            where = f"{test_name}: {rule['alert']} {rule['labels']}"
            assert fired, f"{where} never fires"
            assert pending, f"{where} is never checked pending before its for"
            assert silent, f"{where} has no silent case"


def test_committed_rules_also_fit_the_compose_stack_config() -> None:
    """The compose stack's lanes (same pools and lanes, other URLs) yield the committed rules."""
    compose = rule_files(build_model(load_config(ROOT / "deploy" / "lanes.compose.yaml")))
    assert compose == _load(RULES_DIR, "*.rules.yml")
