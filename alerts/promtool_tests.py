"""promtool unit-test files for the generated rules, generated from the same model.

One test file per rule file (``slo-chat.rules.yml`` -> ``slo-chat.test.yml``),
naming its rule file by a path relative to the test file, as promtool resolves it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .model import AlertModel
from .promtool_canary import canary_tests
from .promtool_capacity import capacity_tests
from .promtool_gpu import gpu_tests
from .promtool_health import health_tests
from .promtool_replica import replica_tests
from .promtool_slo import lane_tests
from .rules import CANARY_FILE, HEALTH_FILE, RuleFile, RuleIndex, slo_file
from .timeline import minute


def unit_file_name(rule_file: str) -> str:
    """``slo-chat.rules.yml`` -> ``slo-chat.test.yml``."""
    return rule_file.replace(".rules.yml", ".test.yml")


def promtool_files(
    model: AlertModel, files: dict[str, RuleFile], rules_dir: Path, tests_dir: Path
) -> dict[str, dict[str, Any]]:
    """Test file name -> promtool test document, for every rule file in ``files``."""
    index = RuleIndex(files)
    rel = Path(os.path.relpath(rules_dir, tests_dir)).as_posix()
    out: dict[str, dict[str, Any]] = {}
    for lane in model.slo_lanes:
        name = slo_file(lane)
        out[unit_file_name(name)] = _doc(f"{rel}/{name}", lane_tests(model, lane, index))
    health = health_tests(model, index) + capacity_tests(model, index) + gpu_tests(model, index)
    health += replica_tests(model, index)  # obs.alerts.replica_rules, gpu_fault_rules
    out[unit_file_name(HEALTH_FILE)] = _doc(f"{rel}/{HEALTH_FILE}", health)
    if CANARY_FILE in files:
        out[unit_file_name(CANARY_FILE)] = _doc(f"{rel}/{CANARY_FILE}", canary_tests(model, index))
    return out


def _doc(rule_file: str, tests: list[dict[str, Any]]) -> dict[str, Any]:
    return {"rule_files": [rule_file], "evaluation_interval": minute(60), "tests": tests}
