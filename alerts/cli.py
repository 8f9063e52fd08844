"""``vllm-obs alerts``: write Prometheus rule files (and their promtool tests) from a config."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

DESCRIPTION = """\
Write Prometheus recording and alerting rules for the lanes/SLO config:
one slo-<lane>.rules.yml per lane with SLOs (SLI error ratios, burn rates,
error budget, multi-window burn-rate alerts) and health.rules.yml (KV cache,
prefix cache, admission, queue wait, pool health, exporters), and, for lanes
with a split, canary.rules.yml (VllmObsCanaryRollback). With --tests,
also write promtool unit tests for every alert (run: promtool test rules
DIR/*.test.yml); --out and --tests may name the same directory. With
--alertmanager FILE, also write the Alertmanager routing (one page per pool
incident). Generated files of the same kind that a new run no longer produces
are removed; other files in the directories are left alone.

For staging and end-to-end tests, --max-for and --max-interval cap every
alert's hold and every rule group's evaluation interval, so an alert fires
seconds after its condition holds instead of minutes; expressions, windows
and names stay as in production. Never use them for production rules.
"""


RULES_KIND = "*.rules.yml"  # what a run may remove as stale: its own kind of file only
TESTS_KIND = "*.test.yml"


def add_parser(subparsers: Any) -> None:
    """Register ``alerts`` on the top-level parser."""
    p = subparsers.add_parser(
        "alerts",
        help="write Prometheus SLO and health rules from the lanes config",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="lanes/SLO config (default: the shipped default lanes)",
    )
    p.add_argument(
        "--out", type=Path, required=True, metavar="DIR", help="directory for the rule files"
    )
    p.add_argument(
        "--tests",
        type=Path,
        default=None,
        metavar="DIR",
        help="also write promtool unit tests for the rules to DIR",
    )
    p.add_argument(
        "--runbook-url",
        default=None,
        metavar="URL",
        help="URL of docs/runbook.md as your responders open it, e.g. "
        "https://github.com/ORG/REPO/blob/main/docs/runbook.md; overrides the lanes "
        "config's alerts.runbook_base_url (with neither: the relative path docs/runbook.md, "
        "which a pager cannot open, and a warning)",
    )
    p.add_argument(
        "--alertmanager",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write the Alertmanager config for these alerts to FILE: pages grouped "
        "by pool, tickets inhibited by pages, lane alerts by their pool's down and "
        "saturation alerts (check: amtool check-config FILE)",
    )
    p.add_argument(
        "--max-for",
        type=_duration,
        default=None,
        metavar="DURATION",
        help="staging/tests only: cap every alert's `for` hold at DURATION (e.g. 0s, 10s)",
    )
    p.add_argument(
        "--max-interval",
        type=_duration,
        default=None,
        metavar="DURATION",
        help="staging/tests only: cap every rule group's own evaluation `interval` at "
        "DURATION (the 30-day budget group runs every 5m)",
    )
    p.set_defaults(handler=run)


def _duration(text: str) -> str:
    from obs.durations import seconds

    try:
        seconds(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e
    return text


def run(args: argparse.Namespace) -> int:
    """Generate and write the files; print each path written."""
    from obs.config import default_config_path, load_config
    from obs.errors import ConfigError

    from .holds import HoldCaps, cap
    from .model import RUNBOOK_PATH, build_model, runbook_base
    from .promtool_tests import promtool_files
    from .rules import rule_files
    from .writer import write, write_alertmanager

    try:
        caps = HoldCaps(args.max_for, args.max_interval)
    except ValueError as e:
        raise ConfigError(f"--max-interval: {e}") from e
    if caps.active and args.tests is not None:
        raise ConfigError(
            "--tests: the promtool tests check the configured holds; write them without "
            "--max-for/--max-interval"
        )
    config_path: Path = args.config or default_config_path()
    config = load_config(config_path)
    base = runbook_base(config, args.runbook_url)
    if base is None:
        print(
            "vllm-obs alerts: warning: no runbook URL (alerts.runbook_base_url in the lanes "
            f"config, or --runbook-url): alerts link to the relative {RUNBOOK_PATH}, which "
            "Alertmanager and pagers cannot open",
            file=sys.stderr,
        )
    model = build_model(config, runbook_url=base or RUNBOOK_PATH)
    files = rule_files(model)
    source = config_path.name
    if caps.active:
        files = cap(files, caps)
        source = f"{source} with {caps.describe()} (staging holds)"
    written = write(args.out, files, source, RULES_KIND)
    if args.tests is not None:
        tests = promtool_files(model, files, args.out, args.tests)
        written += write(args.tests, tests, config_path.name, TESTS_KIND)
    if args.alertmanager is not None:
        written.append(write_alertmanager(args.alertmanager, config_path.name))
    for path in written:
        print(path)
    return 0
