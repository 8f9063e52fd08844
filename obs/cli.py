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

# Each command's module, in the order ``--help`` lists them.
COMMANDS = {
    "sidecar": "obs.sidecar.cli",
    "config": "obs.config_cli",
    "load": "obs.loadgen.cli",
    "alerts": "obs.alerts.cli",
    "dashboards": "obs.dashboards.cli",
    "k8s": "obs.kube.cli",
    "deploy": "obs.deploy.cli",
    "query": "obs.query.cli",
    "clickhouse": "obs.clickhouse.cli",
    "engine": "obs.engines.cli",
    "demo": "obs.demo.cli",
    "sweep": "obs.sweep.cli",
    "plan": "obs.plan.cli",
}


def _modules(argv: Sequence[str] | None) -> list[str]:
    """The modules whose parsers ``argv`` needs: its command's only, when it names one (a
    command does not pay for the others' imports); every one otherwise (``--help``)."""
    first = next((a for a in argv or () if not a.startswith("-")), None)
    if first in COMMANDS:
        return [COMMANDS[first]]
    return list(COMMANDS.values())


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of only the one ``argv`` names."""
    parser = argparse.ArgumentParser(
        prog="vllm-obs",
        description=(
            "Observability and SLOs for vLLM serving: a recording sidecar in front of "
            "`vllm serve` pools, alert rules and Grafana dashboards generated from one "
            "lanes/SLO config, a load generator and postmortem queries over request logs."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _modules(argv):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
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
