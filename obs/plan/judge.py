"""How the plan judges a lane's replayed requests against its SLOs, with the margin. Pure.

As ``obs.query.slo`` judges recorded events (TTFT of a streamed request is its first
token, of a non-streamed one its whole answer; TPOT only where there are two tokens), with
two differences that make the plan stricter:

* every latency is multiplied by ``1 + margin`` first, where ``margin`` is the simulator's
  calibration error (:func:`calibration_margin`), so a plan that passes in the simulator
  still passes on hardware as much slower as the simulator was ever found wrong;
* attainment is over *offered* requests: a refused or failed request misses every SLO of
  its lane. A plan that met its SLOs by refusing traffic would be no plan. Availability
  likewise counts refusals as failures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from obs.config import Lane

# When bench/results/sim_calibration.json is absent or unreadable.
DEFAULT_MARGIN = 0.25


@dataclass(slots=True)
class Outcome:
    """One replayed request."""

    ok: bool
    rejected: bool = False
    ttft_s: float | None = None
    tpot_s: float | None = None
    service_s: float | None = None  # admitted until its last byte (the lane's slot time)
    tokens: int = 0  # prompt + output, served requests only


@dataclass(slots=True)
class Verdict:
    """One lane's replay, judged."""

    lane: str
    offered: int
    ok: int
    rejected: int
    attainment: dict[str, float | None] = field(default_factory=dict)  # kind -> share
    objectives: dict[str, float] = field(default_factory=dict)
    good: int = 0
    tokens: int = 0

    @property
    def met(self) -> bool:
        return all(
            (self.attainment.get(k) or 0.0) >= obj - 1e-12 for k, obj in self.objectives.items()
        )

    @property
    def expected(self) -> float | None:
        """The lowest attainment across the lane's SLOs (its binding one)."""
        values = [v for v in self.attainment.values() if v is not None]
        return min(values) if values else None

    @property
    def slack(self) -> float | None:
        """Attainment minus objective of the binding SLO (negative: missed)."""
        gaps = [(self.attainment.get(k) or 0.0) - o for k, o in self.objectives.items()]
        return min(gaps) if gaps else None

    @property
    def missed(self) -> list[str]:
        return [
            k for k, o in self.objectives.items() if (self.attainment.get(k) or 0.0) < o - 1e-12
        ]


def judge(lane: Lane, outcomes: list[Outcome], margin: float) -> Verdict:
    """``lane``'s SLOs over its replayed ``outcomes`` (see the module docstring)."""
    n = len(outcomes)
    scale = 1.0 + margin
    v = Verdict(lane.name, n, sum(o.ok for o in outcomes), sum(o.rejected for o in outcomes))
    slo = lane.slo
    checks = {}
    if slo.ttft is not None:
        checks["ttft"] = (slo.ttft.threshold_ms / 1000, slo.ttft.objective)
    if slo.tpot is not None:
        checks["tpot"] = (slo.tpot.threshold_ms / 1000, slo.tpot.objective)
    good = 0
    met = dict.fromkeys(checks, 0)
    judged = dict.fromkeys(checks, 0)
    for o in outcomes:
        fine = o.ok
        for kind, (limit, _) in checks.items():
            value = o.ttft_s if kind == "ttft" else o.tpot_s
            if o.ok and value is None:
                continue  # not judged on it (one token, say)
            judged[kind] += 1
            if o.ok and value is not None and value * scale <= limit:
                met[kind] += 1
            else:
                fine = False
        good += fine
        if o.ok:
            v.tokens += o.tokens
    v.good = good
    for kind, (_, objective) in checks.items():
        v.objectives[kind] = objective
        v.attainment[kind] = met[kind] / judged[kind] if judged[kind] else 1.0
    if slo.availability is not None:
        v.objectives["availability"] = slo.availability.objective
        v.attainment["availability"] = v.ok / n if n else 1.0
    return v


def calibration_margin(path: Path) -> tuple[float, str]:
    """The simulator's calibration error from ``bench/results/sim_calibration.json`` and what
    it is: the largest relative error of its held-out points inside the model's declared
    domain (``summary.held_out_in_domain.max_error``), else of all its held-out points
    (``summary.held_out.max_error``), else of its fitted points (``summary.fit.max_error``),
    else the largest error of the comparisons an older file lists; ``DEFAULT_MARGIN``
    without the file. The largest, not the median: the margin must cover every point of
    the simulator's domain it was checked on."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return DEFAULT_MARGIN, f"default {DEFAULT_MARGIN:.0%} ({path.name} unreadable)"
    summary = doc.get("summary") if isinstance(doc, dict) else None
    if isinstance(summary, dict):
        parts = (("held_out_in_domain", "held-out (in the model's domain)"),)
        for key, what in (*parts, ("held_out", "held-out"), ("fit", "fit")):
            part = summary.get(key)
            if not isinstance(part, dict):
                continue
            value = part.get("max_error")
            if isinstance(value, int | float) and value >= 0:
                points = part.get("points", "?")
                median = part.get("median_error")
                about = f", median {median:.1%}" if isinstance(median, int | float) else ""
                return float(value), (
                    f"largest {what} error of the simulator's calibration, {points} points"
                    f"{about} ({path.name})"
                )
    rows = doc if isinstance(doc, list) else []
    errors = []
    for row in rows:
        if not isinstance(row, dict):
            continue
        for key in ("output_ratio", "ttft_ratio"):
            r = row.get(key)
            if isinstance(r, int | float) and r > 0:
                errors.append(1 / r - 1 if r < 1 else r - 1)
    if not errors:
        return DEFAULT_MARGIN, f"default {DEFAULT_MARGIN:.0%} (no error in {path.name})"
    worst = max(errors)
    return worst, f"largest error of {len(errors)} published comparisons ({path.name})"
