"""promtool unit-test files for the generated rules, generated from the same model.

One test file per rule file (``slo-chat.rules.yml`` -> ``slo-chat.test.yml``),
naming its rule file by a path relative to the test file, as promtool resolves it; a lane's
evidence-floor cases, hours of series each, go in a second file on the same rules
(``slo-chat.evidence.test.yml``) evaluated every 5 minutes: promtool evaluates every rule of
the file at each step of each group, and at one-minute steps those cases were three quarters
of the suite's promtool time. Their verdicts are read long after each condition settled, so the
coarser grid gives the same answers; the pending/firing edges stay on the one-minute grid.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .model import AlertModel
from .promtool_canary import canary_tests
from .promtool_capacity import capacity_tests
from .promtool_evidence import lane_evidence_tests
from .promtool_gpu import gpu_tests
from .promtool_health import health_tests
from .promtool_replica import replica_tests
from .promtool_slo import lane_tests
from .rules import CANARY_FILE, HEALTH_FILE, RuleFile, RuleIndex, slo_file
from .timeline import minute

EVIDENCE_STEP_S = 300


def unit_file_name(rule_file: str, part: str = "") -> str:
    """``slo-chat.rules.yml`` -> ``slo-chat.test.yml`` (``slo-chat.evidence.test.yml`` for
    ``part="evidence"``)."""
    return rule_file.replace(".rules.yml", f".{part}.test.yml" if part else ".test.yml")


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
        evidence = lane_evidence_tests(model, lane, index)
        out[unit_file_name(name, "evidence")] = _doc(f"{rel}/{name}", evidence, EVIDENCE_STEP_S)
    health = health_tests(model, index) + capacity_tests(model, index) + gpu_tests(model, index)
    health += replica_tests(model, index)  # obs.alerts.replica_rules, gpu_fault_rules
    out[unit_file_name(HEALTH_FILE)] = _doc(f"{rel}/{HEALTH_FILE}", health)
    if CANARY_FILE in files:
        out[unit_file_name(CANARY_FILE)] = _doc(f"{rel}/{CANARY_FILE}", canary_tests(model, index))
    return out


def _doc(rule_file: str, tests: list[dict[str, Any]], step_s: int = 60) -> dict[str, Any]:
    return {"rule_files": [rule_file], "evaluation_interval": minute(step_s), "tests": tests}
