"""The end of a sweep: the matrix as a table on screen, JSON, CSV and an HTML report."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from obs.query.table import Table, render, to_json
from obs.sweep.matrix import COLUMNS, Matrix, ProfileData, build

if TYPE_CHECKING:
    from obs.sweep.options import SweepOptions
    from obs.sweep.profile import Profile
    from obs.sweep.run import RunRecord

SIMULATED_NOTE = (
    "SIMULATED pools (vllm-obs engine sim, GPU-scale flags): a model of vLLM on the "
    "named GPU, not a measurement (docs/sim.md)"
)
# Columns of the on-screen table (the files keep every column).
SCREEN = tuple(
    c for c in COLUMNS if c not in ("pool", "good", "ttft_attainment", "tpot_attainment")
)
FILES = (
    ("matrix.txt", "the matrix, verdicts and significance as printed"),
    ("matrix.json", "the matrix, verdicts, best profile per lane, tests, runs"),
    ("matrix.csv", "the matrix, one row per profile and lane"),
    ("significance.csv", "each profile against the baseline (query compare's tests)"),
    ("report/report.html", "HTML report with plots"),
    ("runs.json", "every run: profile, round, status, load time, requests"),
    ("runs/", "per profile and round: lanes.yaml, events.jsonl, load.jsonl, logs/"),
)


def profile_data(
    opts: SweepOptions, out: Path, runs: Sequence[RunRecord]
) -> tuple[list[ProfileData], list[str]]:
    """Each profile's finished rounds, in the sweep's order; and notes on runs left out."""
    data, notes = [], []
    for profile in opts.profiles:
        mine = [r for r in runs if r.profile == profile.name]
        ok = [r for r in mine if r.status == "ok" and (out / r.folder / "events.jsonl").exists()]
        for r in mine:
            if r not in ok:
                first = r.message.splitlines()[0] if r.message else ""
                notes.append(f"{r.profile} round {r.round}: {r.status}. {first}".strip())
        if ok:
            events = tuple(str(out / r.folder / "events.jsonl") for r in ok)
            data.append(ProfileData(profile, events, sum(r.wall_s for r in ok)))
    return data, notes


def _pools(profile: Profile, engine: str) -> dict[str, str]:
    if engine == "sim":
        return {k: v.describe() for k, v in profile.gpu_pools().items()}
    return {k: v.describe() for k, v in profile.engines.items()}


def _pct(v: Any) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


def best_lines(matrix: Matrix, alpha: float) -> list[str]:
    lines = []
    for b in matrix.best:
        head = f"  {b['lane']:<13} {b['best']} ({_pct(b['best_share'])} good)"
        if b["runner_up"] is None:
            lines.append(head + ", the only profile with requests")
            continue
        p = b["p_value"]
        verdict = (
            "significant"
            if b["significant"]
            else f"NOT significant at alpha {alpha:g}: a tie on this evidence"
        )
        lines.append(
            f"{head} vs {b['runner_up']} ({_pct(b['runner_up_share'])}): "
            f"p={'-' if p is None else f'{p:.2g}'}, {verdict}"
        )
    return lines


def system_lines(matrix: Matrix, alpha: float) -> list[str]:
    """The whole-system verdict: each profile across all lanes, and the best overall."""
    lines = [
        f"  {r['profile']:<22} offered {r['offered']:>7}  accepted {_pct(r['accepted_share']):>6}"
        f"  good {r['good']:>7} ({_pct(r['goodput_share'])} of offered)"
        + ("" if r["goodput_rps"] is None else f"  {r['goodput_rps']:.2f} good/s")
        for r in matrix.system
    ]
    b = matrix.best_overall
    if b is None:
        return [*lines, "  no profile had requests"]
    head = f"  best overall: {b['best']} ({_pct(b['best_share'])} of offered requests good)"
    if b["runner_up"] is None:
        return [*lines, head]
    p = b["p_value"]
    verdict = "significant" if b["significant"] else f"NOT significant at alpha {alpha:g}"
    return [
        *lines,
        f"{head} vs {b['runner_up']} ({_pct(b['runner_up_share'])}): "
        f"p={'-' if p is None else f'{p:.2g}'}, {verdict}",
    ]


def text(matrix: Matrix, notes: list[str], opts: SweepOptions, wall_s: float, runs: int) -> str:
    table = matrix.table().select(list(SCREEN))
    parts = [
        f"Profile matrix ({opts.command}; {runs} finished runs, sweep wall time {wall_s:.0f} s)",
        render(table, "table"),
        "Verdict per profile (gates: each lane's TTFT and TPOT SLOs, and availability)",
        *(f"  {name:<22} {v}" for name, v in matrix.verdicts.items()),
        "",
        "Best gated goodput per lane (two-proportion z-test against the runner-up)",
        *best_lines(matrix, opts.alpha),
        "",
        "Whole system per profile (all lanes; good = ok and within its lane's gates)",
        *system_lines(matrix, opts.alpha),
    ]
    if opts.engine == "sim":
        parts.insert(1, SIMULATED_NOTE)
    sig = [s for s in matrix.significance if s["metric"] == "goodput_ratio" and s["significant"]]
    parts += ["", f"Goodput differences from the baseline ({matrix.baseline}) beyond noise:"]
    parts += [
        f"  {s['profile']:<22} {s['lane']:<13} {_pct(s['before'])} -> {_pct(s['after'])} "
        f"(p={s['p_value']:.2g})"
        for s in sig
    ] or ["  none"]
    if notes:
        parts += ["", "Runs left out of the matrix:", *(f"  {n}" for n in notes)]
    return "\n".join(parts) + "\n"


def write_results(
    opts: SweepOptions,
    out: Path,
    runs: Sequence[RunRecord],
    wall_s: float,
    say: Callable[[str], None],
) -> str:
    """Build the matrix from the finished runs, write every file; return the text shown."""
    from obs.sweep.report import write_report

    data, notes = profile_data(opts, out, runs)
    matrix = build(data, opts.alpha)
    finished = sum(1 for r in runs if r.status == "ok")
    shown = text(matrix, notes, opts, wall_s, finished)
    (out / "matrix.txt").write_text(shown, encoding="utf-8")
    (out / "matrix.csv").write_text(render(matrix.table(), "csv"), encoding="utf-8")
    sig_cols = list(matrix.significance[0]) if matrix.significance else ["profile"]
    sig = Table(sig_cols, [tuple(s.values()) for s in matrix.significance])
    (out / "significance.csv").write_text(render(sig, "csv"), encoding="utf-8")
    doc = {
        "command": opts.command,
        "engine": opts.engine,
        "simulated": opts.engine == "sim",
        "rounds": opts.rounds,
        "duration_s": opts.duration_s,
        "rate": opts.rate,
        "sessions": opts.sessions,
        "seed": opts.seed,
        "alpha": opts.alpha,
        "wall_s": round(wall_s, 1),
        "baseline": matrix.baseline,
        "profiles": {
            d.profile.name: {
                "description": d.profile.description,
                "source": d.profile.source,
                "rounds": len(d.events),
                "load_s": round(d.wall_s, 3),
                "verdict": matrix.verdicts[d.profile.name],
                "pools": _pools(d.profile, opts.engine),
            }
            for d in data
        },
        "rows": matrix.rows,
        "best": matrix.best,
        "system": matrix.system,
        "best_overall": matrix.best_overall,
        "significance": matrix.significance,
        "left_out": notes,
    }
    (out / "matrix.json").write_text(to_json(doc), encoding="utf-8")
    say("[report] writing report/report.html")
    write_report(out / "report", data, matrix, opts, wall_s)
    files = "".join(
        f"  {name:<20} {what}\n" for name, what in FILES if (out / name.rstrip("/")).exists()
    )
    return shown + f"\nFiles in {out}:\n{files}"
