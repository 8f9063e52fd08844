"""``vllm-obs dashboards``: write the Grafana dashboards for a lanes config."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "dashboards",
        help="write Grafana dashboards (JSON) generated from a lanes/SLO config",
        description=(
            "Generate the vllm-obs Grafana dashboards (overview, lane drill-down, pools and KV, "
            "admission, SLOs) from a lanes/SLO config and write one <uid>.json per dashboard "
            "to DIR, ready to import or to provision. With --check, write nothing and exit 1 "
            "if any file in DIR differs from what the config generates."
        ),
    )
    p.add_argument(
        "--config", metavar="FILE", help="lanes YAML file (default: the shipped default)"
    )
    p.add_argument(
        "--out", metavar="DIR", required=True, help="directory to write the JSON files to"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="compare DIR with the generated dashboards instead of writing; exit 1 on a difference",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from obs.config import default_config_path, load_config
    from obs.dashboards.build import stale, write

    config = load_config(args.config or default_config_path())
    out = Path(args.out)
    if args.check:
        differ = stale(config, out)
        for name in differ:
            print(f"{out / name}: differs from the generated dashboard", file=sys.stderr)
        return 1 if differ else 0
    for path in write(config, out):
        print(path)
    return 0
