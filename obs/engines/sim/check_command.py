"""``vllm-obs engine sim check RESULT.json...``: the simulator against your own benchmark.

The parser only: the handler (obs.plan.check_cli) replays the files on the virtual-time
replica of the stress replay (obs.sweep.virtual), a layer above the engines package, so
it is imported when the command runs (pyproject.toml's one allowed reach up for it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

DESCRIPTION = """\
Replay `vllm bench serve --save-result` files (vLLM's own JSON; with --save-detailed the
per-request lengths and send times are replayed exactly, without it the file's means, with
a warning) on a simulated replica set up as your server was (the flags below, as for
`engine sim`; unset scheduler limits take vLLM's own defaults for the GPU), and print per
file and metric the measured figure, the simulated one and their ratio (mean, median and
p99 TTFT, TPOT, ITL and E2E latency where the file has them; request and output
throughput), then a summary: median |error|, the worst ratio, the share within 25%.
Files given together run in order on one simulated server (its prefix cache stays warm),
as vLLM's benchmarks run several rates against one server, unless --fresh.

--fit FILE fits this host's corrections on the files and writes them as a calibration
file; `engine sim`, `sweep` and `plan` take it (--calibration FILE), and `check
--calibration FILE` on other runs of the same host reports the corrected error.
docs/sim.md, "Your own benchmarks", has the walk-through.
"""


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from obs.engines.sim.cli import add_hardware_flags

    p = commands.add_parser(
        "check",
        help="the simulator against `vllm bench serve --save-result` files of your server",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("results", nargs="+", metavar="RESULT.json", help="vllm bench serve results")
    add_hardware_flags(p)
    p.add_argument(
        "--max-num-batched-tokens", type=int, metavar="N", help="default: vLLM's for the GPU"
    )
    p.add_argument("--max-num-seqs", type=int, metavar="N", help="default: vLLM's for the GPU")
    p.add_argument("--long-prefill-token-threshold", type=int, default=0, metavar="N")
    p.add_argument(
        "--num-scheduler-steps",
        type=int,
        default=1,
        metavar="N",
        help="vLLM 0.6's multi-step scheduling (V0 only; default 1)",
    )
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--block-size", type=int, default=16, metavar="TOKENS")
    p.add_argument("--num-gpu-blocks-override", type=int, metavar="N")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, metavar="SHARE")
    p.add_argument(
        "--fresh", action="store_true", help="replay each file on a fresh replica (cold cache)"
    )
    p.add_argument("--json", type=Path, metavar="OUT", help="write the rows and summary here")
    p.add_argument(
        "--fit", type=Path, metavar="CALIBRATION", help="fit this host's corrections, write them"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of drawn arrivals (default 0)")
    for flag in UNMODELLED:  # taken, to be refused by name (argparse would say "unrecognized")
        p.add_argument(flag, nargs="?", const="", default=None, help=argparse.SUPPRESS)
    p.set_defaults(handler=run)


# vLLM flags a user may pass that change timing in ways the simulator does not model.
UNMODELLED = {
    "--speculative-config": "speculative decoding",
    "--pipeline-parallel-size": "pipeline parallelism",
    "--enable-lora": "LoRA adapters",
    "--max-num-partial-prefills": "concurrent partial prefills",
    "--enforce-eager": "eager mode (no CUDA graphs)",
}


def run(args: argparse.Namespace) -> int:
    from obs.plan.check_cli import run as check

    return check(args)
