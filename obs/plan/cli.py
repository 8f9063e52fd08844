"""``vllm-obs plan``: argument parsing only; the planner is imported by the handler."""

from __future__ import annotations

import argparse
from pathlib import Path

DESCRIPTION = """\
From recorded request events to the replicas and lane limits that meet every SLO.
Reads EVENTS (JSONL files, globs, a Parquet dataset or one clickhouse://HOST:8123/DB.TABLE),
scales each lane's arrival rate by --growth and draws the arrivals again (a Poisson process
per interval of the recording, not the recorded instants compressed), and replays them
against simulated GPU pools in virtual time, with the sidecar's own admission and routing
code. Per pool: the fewest replicas with which every lane meets its SLOs (latencies padded
by the simulator's calibration error); per lane: max_concurrency and max_queue by Little's
law, checked by replay; then one replica fewer, to show which lane misses first. Writes
--out/plan.json, lanes.yaml (the config with the planned limits), report.html (the
replicas-vs-attainment curve) and k8s/POOL/replicas.yaml (a kustomize patch). See
docs/plan.md.
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "plan",
        help="replicas and lane limits that meet every SLO, from recorded traffic",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("events", nargs="+", metavar="EVENTS", help="event logs or clickhouse:// URL")
    p.add_argument(
        "--config",
        required=True,
        metavar="FILE",
        help="the lanes config (or a sweep profile, whose gpu: blocks size each pool)",
    )
    p.add_argument(
        "--growth", type=float, default=1.0, help="traffic multiplier to plan for (default 1)"
    )
    p.add_argument(
        "--gpu",
        action="append",
        default=[],
        metavar="[POOL=]NAME",
        help="simulated GPU of every pool, or of one pool (repeatable; default H100, or the "
        "profile's gpu: block)",
    )
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="[POOL=]NAME",
        help="simulated model, likewise (default llama-3.1-8b)",
    )
    p.add_argument(
        "--window",
        metavar="DURATION",
        help="plan from the last DURATION of the events (7d, 12h; default: all of them)",
    )
    p.add_argument("--out", type=Path, default=Path("plan"), help="output folder (default plan)")
    p.add_argument("--seed", type=int, default=0, help="seed of the resampled arrivals")
    p.add_argument(
        "--max-requests",
        type=int,
        default=200_000,
        help="requests one replay may hold; above it the busiest span of the window that "
        "fits is replayed (default 200000)",
    )
    p.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE",
        help="this host's calibration (`vllm-obs engine sim check --fit`): the simulator runs "
        "with its corrections and the margin is its largest error on the benchmarks it was "
        "checked on",
    )
    p.add_argument(
        "--margin",
        type=float,
        help="latency margin, a fraction (default: with --calibration, that file's checked "
        "error; else the built-in model's held-out error from "
        "bench/results/sim_calibration.json)",
    )
    p.add_argument(
        "--k8s",
        type=Path,
        metavar="DIR",
        help="also write DIR/autoscaling/bounds.yaml (DIR: the kustomize package, deploy/k8s): "
        "each pool's autoscaler from the replicas for the recorded traffic (minReplicas) to "
        "those for the traffic grown by --growth (maxReplicas); docs/kubernetes.md",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress lines on stderr (default: on a terminal, or every 10 s elsewhere)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from obs.plan.command import PlanRequest, plan

    request = PlanRequest(
        events=list(args.events),
        config=Path(args.config),
        growth=args.growth,
        gpu=list(args.gpu),
        model=list(args.model),
        window=args.window,
        out=args.out,
        seed=args.seed,
        max_requests=args.max_requests,
        margin=args.margin,
        progress=args.progress,
        calibration=args.calibration,
        k8s=args.k8s,
    )
    return plan(request)
