"""Every Prometheus rule file for a config, as plain data: file name -> ``{"groups": [...]}``."""

from __future__ import annotations

from typing import Any

from .canary_rules import canary_groups
from .capacity_rules import capacity_groups
from .change_rules import change_groups
from .flow_rules import flow_groups
from .gpu_fault_rules import gpu_fault_groups
from .gpu_rules import gpu_groups
from .health_rules import health_groups
from .model import AlertModel
from .replica_rules import replica_groups
from .slo_rules import lane_groups

RuleFile = dict[str, Any]
HEALTH_FILE = "health.rules.yml"
CANARY_FILE = "canary.rules.yml"  # only for a config with split lanes


def slo_file(lane: str) -> str:
    """The rule file of one lane's SLOs."""
    return f"slo-{lane}.rules.yml"


def rule_files(model: AlertModel) -> dict[str, RuleFile]:
    """One file per lane with SLOs, then the health rules (and the canary rules of split
    lanes); in a stable order."""
    files = {slo_file(lane): {"groups": lane_groups(model, lane)} for lane in model.slo_lanes}
    groups = health_groups(model) + capacity_groups(model) + flow_groups(model)
    groups += replica_groups(model) + gpu_fault_groups(model)  # one replica; GPU faults
    files[HEALTH_FILE] = {"groups": groups + change_groups(model) + gpu_groups(model)}
    canary = canary_groups(model)
    if canary:
        files[CANARY_FILE] = {"groups": canary}
    return files


def alerts(files: dict[str, RuleFile]) -> list[dict[str, Any]]:
    """Every alerting rule in ``files``."""
    return [
        rule
        for f in files.values()
        for group in f["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]


class RuleIndex:
    """Find a generated alerting rule by name and (a subset of) its static labels."""

    def __init__(self, files: dict[str, RuleFile]) -> None:
        self._alerts = alerts(files)

    def find(self, alert: str, **labels: str) -> dict[str, Any]:
        """The one rule named ``alert`` whose labels include ``labels``."""
        found = [
            r for r in self._alerts if r["alert"] == alert and labels.items() <= r["labels"].items()
        ]
        if len(found) != 1:
            raise LookupError(f"{len(found)} rules match {alert} {labels}")
        return found[0]
