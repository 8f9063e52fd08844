"""The lab's stress, reproduced on simulated GPU pools: six profiles x N requests, six-class mix.

Each profile replays the same seeded plan (``vllm-obs load``'s six-class default mix,
open loop at ``--rate`` sessions/s) through the sidecar's classifier, admission gates
and router onto its ``gpu:`` pools of simulated vLLM replicas, in virtual time
(obs.sweep.replay); the matrix is the sweep's (obs.sweep.matrix: the query engine's
goodput, per lane and whole-system). Every request is accounted for: the events
written equal the requests planned, and the result file says so.

    python -m bench.stress --requests 600000 --profile single-balanced --events DIR
    python -m bench.stress --matrix --events DIR --out bench/results/stress.json

The first form replays one profile (run it once per profile: each stays well under
the machine's 12-minute heavy-work slot); the second builds the matrix from the
event files found and writes the result file. ``--profile all`` runs every profile
in one process (CI's small version does that with a few thousand requests).

The **load sweep** replays every profile at several offered loads, each a multiple of
the single-pool baseline's modelled capacity (obs.sweep.capacity), and at each load
also with every step time scaled by ``1 - band`` and ``1 + band`` (the calibration's
error): per load, the matrix, each profile's good share with its calibration band,
and each profile paired with the baseline on the same planned requests (the
difference in good share, a 95% interval over the paired requests, widened to the
union of the three scales' intervals):

    python -m bench.stress --sweep --requests 20000 --loads 0.6,1.0,1.3 --band 0.17 \
        --events /tmp/sweep --out bench/results/stress_sweep.json
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from obs.loadgen.mix import load_mix
from obs.query.scan import SRC, Scan, connect
from obs.query.slo import judged_rows
from obs.query.table import render, to_json
from obs.sweep.capacity import HEADROOM, Sizing, size
from obs.sweep.matrix import COLUMNS, ProfileData, build
from obs.sweep.profile import SHIPPED, resolve
from obs.sweep.replay import Replay

# The single-profile form's rate (sessions/s; about 1.16x the baseline's modelled capacity
# of 31 sessions/s, obs.sweep.capacity); the load sweep takes its rates from that capacity.
DEFAULT_RATE = 36.0
SEED = 0


@functools.cache
def _sizing(name: str) -> Sizing:
    return size(resolve(name), load_mix())


def replay_one(
    name: str,
    requests: int,
    rate: float,
    events: Path,
    scale: float = 1.0,
    load: float | None = None,
) -> dict[str, Any]:
    """Replay ``requests`` of the plan on profile ``name``; its run record."""
    started = time.monotonic()
    events.mkdir(parents=True, exist_ok=True)
    profile = resolve(name)
    sizing = _sizing(name)
    replay = Replay(profile, load_mix(), events / f"{name}.jsonl.gz", scale=scale, sizing=sizing)
    result = replay.run(requests, rate, SEED)
    real_s = time.monotonic() - started
    record: dict[str, Any] = {
        "profile": name,
        "planned": requests,
        "sent": replay.sent,
        "events": result.requests,
        "virtual_s": round(result.virtual_s, 1),
        "engine_steps": result.engine_steps,
        "real_s": round(real_s, 1),
        "real_ms_per_request": round(1000 * real_s / max(1, requests), 3),
        "rate": rate,
        "load": load,
        "scale": scale,
        "admission": profile.admission,
        "limits": {k: v.max_concurrency for k, v in replay.admission.items()},
    }
    (events / f"{name}.run.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def matrix_doc(events: Path, alpha: float = 0.01) -> dict[str, Any]:
    """The matrix over every profile whose events are in ``events``."""
    runs, data = [], []
    for name in SHIPPED:
        run_file = events / f"{name}.run.json"
        if not run_file.exists():
            continue
        run = json.loads(run_file.read_text())
        runs.append(run)
        data.append(
            ProfileData(resolve(name), (str(events / f"{name}.jsonl.gz"),), run["virtual_s"])
        )
    t = time.monotonic()
    matrix = build(data, alpha)
    return {
        "what": "six-class mix over each profile's simulated GPU pools, replayed in virtual "
        "time through the sidecar's classifier, admission and routing (bench/stress.py)",
        "engine": "sim",
        "simulated": True,
        "seed": SEED,
        "runs": runs,
        "accounted": all(r["events"] == r["planned"] == r["sent"] for r in runs),
        "matrix_build_s": round(time.monotonic() - t, 1),
        "system": matrix.system,
        "best_overall": matrix.best_overall,
        "best_per_lane": matrix.best,
        "verdicts": matrix.verdicts,
        "rows": matrix.rows,
        "table": render(matrix.table().select(list(COLUMNS)), "table"),
    }


def good_flags(name: str, events: Path) -> dict[str, int]:
    """Each request's good flag (ok and within its lane's gates: the query engine's rule)."""
    profile = resolve(name)
    scan = Scan([str(events / f"{name}.jsonl.gz")], con=connect(), progress=False)
    rows = judged_rows(profile.config, SRC, scan.dialect)
    sql = f"SELECT request_id, CAST(_good AS INTEGER) AS good FROM {rows}"
    return {r["request_id"]: int(r["good"]) for r in scan.run(sql).records()}


def paired(a: dict[str, int], b: dict[str, int]) -> tuple[float, float, float]:
    """Mean of ``a - b`` over the requests both have, and its 95% interval (normal)."""
    diffs = [a[k] - b[k] for k in a.keys() & b.keys()]
    n = len(diffs)
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / max(1, n - 1)
    half = 1.96 * math.sqrt(var / n)
    return mean, mean - half, mean + half


CODE_PATHS = ("obs", "bench", "sidecar", ":(exclude)bench/results")


def _version() -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", *CODE_PATHS],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+uncommitted" if dirty else "")


def _finished(
    folder: Path, name: str, requests: int, load: float, scale: float
) -> dict[str, Any] | None:
    """The run record of a replay already done with these settings (``--resume``)."""
    path = folder / f"{name}.run.json"
    if not path.exists() or not (folder / f"{name}.jsonl.gz").exists():
        return None
    run: dict[str, Any] = json.loads(path.read_text())
    same = run.get("planned") == requests and run.get("load") == load
    return run if same and run.get("scale") == scale else None


LANE_FIELDS = (
    "profile",
    "lane",
    "pool",
    "requests",
    "good",
    "goodput_share",
    "rejected",
    "ttft_p99_ms",
    "tpot_p95_ms",
)


def _level(
    nominal: Path,
    flags: dict[float, dict[str, dict[str, int]]],
    scales: list[float],
    requests: int,
) -> dict[str, Any]:
    """One load's matrix (at scale 1), each profile's good share over the scales, and each
    profile paired with the baseline at every scale."""
    data = [
        ProfileData(
            resolve(n),
            (str(nominal / f"{n}.jsonl.gz"),),
            json.loads((nominal / f"{n}.run.json").read_text())["virtual_s"],
        )
        for n in SHIPPED
    ]
    matrix = build(data, 0.01)
    system = []
    for row in matrix.system:
        name = row["profile"]
        shares = [sum(flags[s][name].values()) / requests for s in scales]
        # Rounded outward to 4 places, so the band holds the unrounded share it brackets.
        band = [math.floor(min(shares) * 1e4) / 1e4, math.ceil(max(shares) * 1e4) / 1e4]
        row = {**row, "good_share_band": band}
        if name != SHIPPED[0]:
            each = [paired(flags[s][name], flags[s][SHIPPED[0]]) for s in scales]
            mid = each[scales.index(1.0)]
            row["vs_baseline"] = {
                "difference": round(mid[0], 4),
                "interval_95": [round(mid[1], 4), round(mid[2], 4)],
                "interval_with_calibration": [
                    round(min(e[1] for e in each), 4),
                    round(max(e[2] for e in each), 4),
                ],
            }
        system.append(row)
    lanes = [{k: r[k] for k in LANE_FIELDS if k in r} for r in matrix.rows]
    return {"system": system, "best_overall": matrix.best_overall, "lanes": lanes}


def sweep(
    requests: int,
    loads: list[float],
    band: float,
    events: Path,
    progress: bool = True,
    resume: bool = False,
) -> dict[str, Any]:
    """Every profile at every load and scale; the per-load matrices and paired comparisons."""
    version = _version()
    capacity = _sizing(SHIPPED[0]).sessions_per_s
    scales = sorted({round(1 - band, 4), 1.0, round(1 + band, 4)})
    runs: list[dict[str, Any]] = []
    levels = []
    for load in loads:
        rate = load * capacity
        flags: dict[float, dict[str, dict[str, int]]] = {}
        for scale in scales:
            folder = events / f"load{load:g}-scale{scale:g}"
            for name in SHIPPED:
                run = _finished(folder, name, requests, load, scale) if resume else None
                run = run or replay_one(name, requests, rate, folder, scale, load)
                runs.append(run)
                if progress:
                    print(json.dumps(run), flush=True)
            flags[scale] = {name: good_flags(name, folder) for name in SHIPPED}
        level = _level(events / f"load{load:g}-scale1", flags, scales, requests)
        levels.append({"load": load, "rate_sessions_per_s": round(rate, 3), **level})
    return {
        "what": "the six profiles at several offered loads (multiples of the single-pool "
        "baseline's modelled capacity), simulated GPU pools in virtual time, admission "
        "sized from capacity (bench/stress.py --sweep)",
        "engine": "sim",
        "simulated": True,
        "code_version": version,
        "seed": SEED,
        "requests_per_run": requests,
        "baseline": SHIPPED[0],
        "baseline_capacity_sessions_per_s": round(capacity, 3),
        "admission_headroom": HEADROOM,
        "calibration_band": band,
        "scales": scales,
        "accounted": all(r["events"] == r["planned"] == r["sent"] for r in runs),
        "runs": runs,
        "levels": levels,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", action="append", default=[], help="a shipped profile, or all")
    p.add_argument("--requests", type=int, default=600_000)
    p.add_argument("--rate", type=float, default=DEFAULT_RATE, help="sessions/s (36)")
    p.add_argument("--events", type=Path, required=True, help="folder for the event files")
    p.add_argument("--matrix", action="store_true", help="build the matrix from --events")
    p.add_argument("--out", type=Path, help="result file (JSON) for --matrix or --sweep")
    p.add_argument("--sweep", action="store_true", help="every profile at every --loads")
    p.add_argument(
        "--loads",
        default="0.6,1.0,1.3",
        help="offered loads, multiples of the baseline's capacity (default 0.6,1.0,1.3)",
    )
    p.add_argument(
        "--band",
        type=float,
        default=0.17,
        help="calibration band: also replay with step times x (1 +- band) (default 0.17)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="--sweep: keep the replays already in --events with the same settings",
    )
    args = p.parse_args(argv)
    args.events.mkdir(parents=True, exist_ok=True)
    if args.sweep:
        try:
            loads = [float(x) for x in args.loads.split(",")]
        except ValueError:
            p.error(f"--loads {args.loads!r}: give numbers separated by commas")
        if not loads or min(loads) <= 0 or not 0 <= args.band < 1:
            p.error("--loads must be positive and --band in [0, 1)")
        doc = sweep(args.requests, loads, args.band, args.events, resume=args.resume)
        for level in doc["levels"]:
            for row in level["system"]:
                print(json.dumps({"load": level["load"], **row}))
        if args.out is not None:
            args.out.write_text(to_json(doc))
        return 0
    names = list(SHIPPED) if "all" in args.profile else args.profile
    for name in names:
        if name not in SHIPPED:
            p.error(f"--profile {name!r}: one of {', '.join(SHIPPED)} or all")
        print(json.dumps(replay_one(name, args.requests, args.rate, args.events)), flush=True)
    if args.matrix:
        doc = matrix_doc(args.events)
        print(doc["table"])
        for row in doc["system"]:
            print(json.dumps(row))
        print(json.dumps(doc["best_overall"]))
        if args.out is not None:
            args.out.write_text(to_json({k: v for k, v in doc.items() if k != "table"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
