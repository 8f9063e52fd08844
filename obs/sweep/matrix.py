"""The profile matrix: per profile and lane, gated goodput, latencies, rejections, verdicts.

Every number comes from the query engine over the profile's events (all its
finished rounds together): ``summary`` for the per-lane figures, ``compare``
(two-proportion z-test and Mann-Whitney U) for each profile against the
baseline, and the same two-proportion test for the best profile of a lane
against the runner-up. The whole-system rows add up every lane of a profile: the
share of offered requests that were accepted and that were good, and the best
profile overall with the same test against its runner-up. A request is *good* when
it is ``ok`` and meets its lane's TTFT and TPOT SLOs (the gates; ``docs/query.md``
has the exact rules).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from obs.query.aggregate import summary
from obs.query.comparison import compare
from obs.query.scan import Scan, connect
from obs.query.stats import two_proportions
from obs.query.table import Table
from obs.query.throughput import RATE_COLUMNS
from obs.sweep.profile import Profile

COLUMNS = (
    "profile",
    "lane",
    "pool",
    "requests",
    "good",
    "goodput_rps",
    "goodput_share",
    *RATE_COLUMNS,
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p99_ms",
    "tpot_p95_ms",
    "stream_p95_ms",
    "rejected",
    "errors",
    "ttft_attainment",
    "tpot_attainment",
    "gates",
)
# Metrics of `compare` kept for the significance table.
COMPARED = ("goodput_ratio", "ttft_p50_ms", "ttft_p99_ms", "tpot_p95_ms")
GATES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("availability", "availability"))


@dataclass(frozen=True, slots=True)
class ProfileData:
    """A profile's finished rounds: their event files and the load's wall time in total."""

    profile: Profile
    events: tuple[str, ...]
    wall_s: float


@dataclass(slots=True)
class Matrix:
    rows: list[dict[str, Any]] = field(default_factory=list)
    verdicts: dict[str, str] = field(default_factory=dict)
    best: list[dict[str, Any]] = field(default_factory=list)
    significance: list[dict[str, Any]] = field(default_factory=list)
    baseline: str | None = None
    system: list[dict[str, Any]] = field(default_factory=list)
    best_overall: dict[str, Any] | None = None

    def table(self) -> Table:
        return Table(list(COLUMNS), [tuple(r[c] for c in COLUMNS) for r in self.rows])


def _count(rate: float | None, n: int) -> int:
    return 0 if rate is None else round(rate * n)


def gate_verdict(row: dict[str, Any]) -> tuple[str, list[str]]:
    """``met``, ``misses ...`` or ``no gate`` for one summary row; and the gates missed."""
    missed = [label for kind, label in GATES if row.get(f"{kind}_slo_met") is False]
    judged = [kind for kind, _ in GATES if row.get(f"{kind}_slo_met") is not None]
    if missed:
        return "misses " + ", ".join(missed), missed
    return ("met" if judged else "no gate"), []


def lane_rows(data: ProfileData, scan: Scan) -> list[dict[str, Any]]:
    """The matrix rows of one profile, one per lane that saw requests."""
    config = data.profile.config
    rows = []
    for rec in summary(scan, config).records():
        lane, n = rec["lane"], rec["requests"]
        verdict, _ = gate_verdict(rec)
        pool = config.lane(lane).pool if lane in config.lane_names else None
        rows.append(
            {
                "profile": data.profile.name,
                "lane": lane,
                "pool": pool,
                "requests": n,
                "good": rec["good"],
                "goodput_rps": rec["good"] / data.wall_s if data.wall_s else None,
                "goodput_share": rec["goodput_ratio"],
                **{k: rec.get(k) for k in RATE_COLUMNS},  # tokens/s over the rounds' events
                "ttft_p50_ms": rec["ttft_p50_ms"],
                "ttft_p99_ms": rec["ttft_p99_ms"],
                "itl_p99_ms": rec["itl_p99_ms"],
                "tpot_p95_ms": rec["tpot_p95_ms"],
                "stream_p95_ms": rec["stream_p95_ms"],
                "rejected": _count(rec["rejection_rate"], n),
                "errors": _count(rec["error_rate"], n),
                "ttft_attainment": rec["ttft_attainment"],
                "tpot_attainment": rec["tpot_attainment"],
                "gates": verdict,
                "_missed": gate_verdict(rec)[1],
            }
        )
    return rows


def profile_verdict(rows: list[dict[str, Any]]) -> str:
    """One line: which lanes miss which gates, or that every gate is met."""
    misses = [f"{r['lane']} {'+'.join(r['_missed'])}" for r in rows if r["_missed"]]
    if not rows:
        return "no requests recorded"
    return "meets every gate" if not misses else "misses " + ", ".join(misses)


def best_per_lane(rows: list[dict[str, Any]], alpha: float) -> list[dict[str, Any]]:
    """Per lane: the profile with the highest goodput share, tested against the runner-up."""
    lanes: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["requests"]:
            lanes.setdefault(r["lane"], []).append(r)
    return [{"lane": lane, **_best(group, "requests", alpha)} for lane, group in lanes.items()]


def _best(rows: list[dict[str, Any]], total: str, alpha: float) -> dict[str, Any]:
    """The row with the highest goodput share (ties by profile name), tested against the
    runner-up with a two-proportion z-test of good requests out of ``total``."""
    top, *rest = sorted(rows, key=lambda r: (-(r["goodput_share"] or 0.0), r["profile"]))
    entry: dict[str, Any] = {
        "best": top["profile"],
        "best_share": top["goodput_share"],
        "runner_up": None,
        "runner_up_share": None,
        "p_value": None,
        "significant": None,
    }
    if rest:
        second = rest[0]
        p = two_proportions(second["good"], second[total], top["good"], top[total])
        entry.update(
            runner_up=second["profile"],
            runner_up_share=second["goodput_share"],
            p_value=p,
            significant=None if p is None else p < alpha,
        )
    return entry


def system_rows(rows: list[dict[str, Any]], wall_s: dict[str, float]) -> list[dict[str, Any]]:
    """Per profile, across all its lanes: requests offered, accepted (not refused by
    admission), good (gated goodput), and the shares of the offered requests."""
    out = []
    for name, load_s in wall_s.items():
        mine = [r for r in rows if r["profile"] == name]
        offered = sum(r["requests"] for r in mine)
        good = sum(r["good"] for r in mine)
        accepted = offered - sum(r["rejected"] for r in mine)
        out.append(
            {
                "profile": name,
                "offered": offered,
                "accepted": accepted,
                "accepted_share": accepted / offered if offered else None,
                "good": good,
                "goodput_share": good / offered if offered else None,
                "goodput_rps": good / load_s if load_s else None,
            }
        )
    return out


def best_system(system: list[dict[str, Any]], alpha: float) -> dict[str, Any] | None:
    """The profile with the highest share of offered requests that were good, tested
    against the runner-up (two-proportion z-test)."""
    offered = [r for r in system if r["offered"]]
    return _best(offered, "offered", alpha) if offered else None


def against_baseline(
    base: ProfileData, base_scan: Scan, other: ProfileData, other_scan: Scan, alpha: float
) -> list[dict[str, Any]]:
    """``compare`` of a profile with the baseline, per lane, on the metrics in COMPARED."""
    table = compare(base_scan, other_scan, other.profile.config, alpha)
    out = []
    for rec in table.records():
        if rec["metric"] in COMPARED:
            out.append({"profile": other.profile.name, "baseline": base.profile.name, **rec})
    return out


def build(profiles: list[ProfileData], alpha: float) -> Matrix:
    """The matrix over every profile with finished rounds; the first is the baseline."""
    matrix = Matrix()
    con = connect()
    # One scan per profile, alive for the whole build: a scan names its temporary table
    # after itself, so a scan freed early could hand its name to the next one.
    scans = [Scan(list(d.events), con=con, progress=False) for d in profiles]
    for data, scan in zip(profiles, scans, strict=True):
        rows = lane_rows(data, scan)
        matrix.rows += rows
        matrix.verdicts[data.profile.name] = profile_verdict(rows)
    matrix.best = best_per_lane(matrix.rows, alpha)
    matrix.system = system_rows(matrix.rows, {d.profile.name: d.wall_s for d in profiles})
    matrix.best_overall = best_system(matrix.system, alpha)
    if profiles:
        matrix.baseline = profiles[0].profile.name
        for other, scan in zip(profiles[1:], scans[1:], strict=True):
            matrix.significance += against_baseline(profiles[0], scans[0], other, scan, alpha)
    for r in matrix.rows:
        r.pop("_missed")
    return matrix
