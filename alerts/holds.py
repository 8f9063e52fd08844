"""Shorter holds for staging and tests: cap every alert's ``for`` and every group's interval.

The production holds (``for: 10m`` on a KV cache alert, a 30-day budget recomputed every
5 minutes) are right for production and make a staging check, or an end-to-end test,
wait minutes to see an alert fire. ``cap`` rewrites the generated rule data (plain
data in, plain data out): each ``for`` longer than ``max_for`` becomes ``max_for``, each
group ``interval`` longer than ``max_interval`` becomes ``max_interval``. Expressions,
windows, rule names and labels are unchanged, so dashboards and routing work as in
production; the annotations still describe the production hold.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from obs.durations import seconds

from .rules import RuleFile


@dataclass(frozen=True, slots=True)
class HoldCaps:
    """Upper bounds for alert holds and group intervals (Prometheus durations); None: keep."""

    max_for: str | None = None
    max_interval: str | None = None

    def __post_init__(self) -> None:
        for value in (self.max_for, self.max_interval):
            if value is not None:
                seconds(value)  # raises ValueError naming the bad duration
        if self.max_interval is not None and seconds(self.max_interval) <= 0:
            raise ValueError(f"{self.max_interval!r}: a group interval must be longer than 0")

    @property
    def active(self) -> bool:
        """True when at least one cap is set."""
        return self.max_for is not None or self.max_interval is not None

    def describe(self) -> str:
        """The options as given (``--max-for 1s --max-interval 1s``), for the file header."""
        parts = []
        if self.max_for is not None:
            parts.append(f"--max-for {self.max_for}")
        if self.max_interval is not None:
            parts.append(f"--max-interval {self.max_interval}")
        return " ".join(parts)


def cap(files: dict[str, RuleFile], caps: HoldCaps) -> dict[str, RuleFile]:
    """A copy of ``files`` with every ``for`` and group ``interval`` at most the caps."""
    out = copy.deepcopy(files)
    for data in out.values():
        for group in data["groups"]:
            if caps.max_interval is not None and "interval" in group:
                group["interval"] = _shorter(group["interval"], caps.max_interval)
            for rule in group["rules"]:
                if caps.max_for is not None and "for" in rule:
                    rule["for"] = _shorter(rule["for"], caps.max_for)
    return out


def _shorter(duration: str, limit: str) -> str:
    return limit if seconds(duration) > seconds(limit) else duration
