"""``vllm-obs``: the command-line entry point.

Each subcommand lives in its own module with an ``add_parser(subparsers)``
function. Those modules import only argparse-level code at load time and
import their heavy dependencies inside the handler, so ``vllm-obs query``
does not pay for the web stack and ``vllm-obs sidecar`` not for pandas.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from obs.errors import ObsError

# Subcommand modules, in the order ``--help`` lists them.
COMMANDS = (
    "obs.sidecar.cli",
    "obs.config_cli",
    "obs.loadgen.cli",
    "obs.alerts.cli",
    "obs.dashboards.cli",
    "obs.kube.cli",
    "obs.query.cli",
    "obs.clickhouse.cli",
    "obs.engines.cli",
    "obs.demo.cli",
    "obs.sweep.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-obs",
        description=(
            "Observability and SLOs for vLLM serving: a recording sidecar in front of "
            "`vllm serve` pools, alert rules and Grafana dashboards generated from one "
            "lanes/SLO config, a load generator and postmortem queries over request logs."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except ObsError as e:
        print(f"vllm-obs {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as e:
        if os.environ.get("VLLM_OBS_DEBUG"):
            raise
        print(
            f"vllm-obs {args.command}: error: missing Python package {e.name!r}; "
            f"reinstall vllm-obs (pip install vllm-obs) to get its dependencies",
            file=sys.stderr,
        )
        return 2
    except Exception as e:
        if os.environ.get("VLLM_OBS_DEBUG"):
            raise
        print(
            f"vllm-obs {args.command}: internal error: {e!r} "
            "(set VLLM_OBS_DEBUG=1 for the traceback, and please report it)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
