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
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from obs.loadgen.mix import load_mix
from obs.query.table import render, to_json
from obs.sweep.matrix import COLUMNS, ProfileData, build
from obs.sweep.profile import SHIPPED, resolve
from obs.sweep.replay import Replay

# 36 sessions/s (~60 requests/s) loads the class-aware pools' 4 simulated H100s to
# about three quarters of their modelled capacity (docs/sweep.md, "The stress").
DEFAULT_RATE = 36.0
SEED = 0


def replay_one(name: str, requests: int, rate: float, events: Path) -> dict[str, Any]:
    """Replay ``requests`` of the plan on profile ``name``; its run record."""
    started = time.monotonic()
    replay = Replay(resolve(name), load_mix(), events / f"{name}.jsonl.gz")
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", action="append", default=[], help="a shipped profile, or all")
    p.add_argument("--requests", type=int, default=600_000)
    p.add_argument("--rate", type=float, default=DEFAULT_RATE, help="sessions/s (36)")
    p.add_argument("--events", type=Path, required=True, help="folder for the event files")
    p.add_argument("--matrix", action="store_true", help="build the matrix from --events")
    p.add_argument("--out", type=Path, help="result file (JSON) for --matrix")
    args = p.parse_args(argv)
    args.events.mkdir(parents=True, exist_ok=True)
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
