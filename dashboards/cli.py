"""``vllm-obs dashboards``: write the Grafana dashboards for a lanes config, or render them.

``vllm-obs dashboards render`` draws what the dashboards show over a time range, from a
Prometheus that scrapes the sidecar, as one PNG per dashboard (no Grafana needed).
"""

from __future__ import annotations

import argparse
import sys

DASHBOARDS = ("overview", "lane", "pools", "admission", "slo")
DEFAULT_RATE_INTERVAL = "1m"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "dashboards",
        usage=(
            "vllm-obs dashboards [--config FILE] --out DIR [--check]\n"
            "       vllm-obs dashboards [--config FILE] render --prometheus URL --out DIR [...]"
        ),
        help="write Grafana dashboards (JSON) generated from a lanes/SLO config",
        description=(
            "Generate the vllm-obs Grafana dashboards (overview, lane drill-down, pools and KV, "
            "admission, SLOs) from a lanes/SLO config and write one <uid>.json per dashboard "
            "to DIR, ready to import or to provision. With --check, write nothing and exit 1 "
            "if any file in DIR differs from what the config generates. "
            "'vllm-obs dashboards render' draws the same panels from a Prometheus into PNGs."
        ),
    )
    p.add_argument(
        "--config", metavar="FILE", help="lanes YAML file (default: the shipped default)"
    )
    p.add_argument("--out", metavar="DIR", help="directory to write the JSON files to (required)")
    p.add_argument(
        "--check",
        action="store_true",
        help="compare DIR with the generated dashboards instead of writing; exit 1 on a difference",
    )
    p.set_defaults(handler=run)

    sub = p.add_subparsers(
        dest="dashboards_command", title="subcommands", metavar="render", required=False
    )
    r = sub.add_parser(
        "render",
        prog="vllm-obs dashboards [--config FILE] render",
        help="draw the dashboards' panels from a Prometheus into PNG files",
        description=(
            "Run every panel query of the dashboards (generated from --config, given before "
            "'render') as a range query against a Prometheus that scrapes the sidecar, and draw "
            "each dashboard in its own grid layout into DIR/dashboard-<name>.png. Variables "
            "are filled as Grafana opens the dashboard: every lane, pool and model (the lane "
            "drill-down: the config's default lane), $__range the time range. Prints one line "
            "per file with its panels without data; exits 1 if Prometheus refused a query."
        ),
    )
    r.add_argument("--prometheus", required=True, metavar="URL", help="Prometheus base URL")
    r.add_argument("--out", required=True, metavar="DIR", help="directory for the PNG files")
    r.add_argument(
        "--dashboard",
        action="append",
        choices=DASHBOARDS,
        metavar="NAME",
        help=f"one of {', '.join(DASHBOARDS)} (repeatable; default: all)",
    )
    r.add_argument(
        "--start",
        default="1h",
        metavar="TIME",
        help="range start: ISO 8601 (2025-06-02T14:30Z) or that long ago (15m, 2h; default 1h)",
    )
    r.add_argument("--end", default=None, metavar="TIME", help="range end (default: now)")
    r.add_argument(
        "--step",
        type=float,
        default=None,
        metavar="S",
        help="seconds between points (default: range / 200)",
    )
    r.add_argument(
        "--rate-interval",
        default=DEFAULT_RATE_INTERVAL,
        metavar="DURATION",
        help="what $__rate_interval becomes: at least 4 scrape intervals "
        f"(default {DEFAULT_RATE_INTERVAL})",
    )
    r.add_argument("--lane", metavar="NAME", help="fill $lane with one lane (default: as opened)")
    r.set_defaults(handler=run_render)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from obs.config import default_config_path, load_config
    from obs.dashboards.build import stale, write
    from obs.errors import ConfigError

    if args.out is None:
        raise ConfigError("--out DIR is required")
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


def run_render(args: argparse.Namespace) -> int:
    """Render each chosen dashboard to DIR/dashboard-<name>.png; print a line per file."""
    from datetime import UTC, datetime
    from pathlib import Path

    from obs.config import default_config_path, load_config
    from obs.dashboards.build import render
    from obs.dashboards.plot import draw
    from obs.dashboards.snapshot import default_variables, take
    from obs.durations import parse_duration, parse_time
    from obs.errors import ConfigError
    from obs.prom.api import PrometheusAPI

    config = load_config(args.config or default_config_path())
    now = datetime.now(UTC)
    start = parse_time(args.start, now).replace(tzinfo=UTC).timestamp()
    end = parse_time(args.end, now).replace(tzinfo=UTC).timestamp() if args.end else now.timestamp()
    if end <= start:
        raise ConfigError(f"--start {args.start} is not before --end {args.end or 'now'}")
    step = args.step or max(1.0, round((end - start) / 200))
    parse_duration(args.rate_interval)  # fails loudly on a bad duration
    if args.lane is not None and args.lane not in config.lane_names:
        raise ConfigError(f"--lane {args.lane}: not a lane of the config")
    api = PrometheusAPI(args.prometheus, timeout_s=30)
    boards = render(config)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    failed = False
    for name in args.dashboard or DASHBOARDS:
        uid = f"vllm-obs-{name}"
        variables = default_variables(config, uid)
        variables["__rate_interval"] = args.rate_interval
        if args.lane is not None:
            variables["lane"] = args.lane
        snap = take(api, boards[uid], start=start, end=end, step=step, variables=variables)
        when = " to ".join(
            datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S") for t in (start, end)
        )
        shown = ", ".join(f"${k}={v}" for k, v in sorted(variables.items()))
        path = out / f"dashboard-{name}.png"
        path.write_bytes(draw(snap, subtitle=f"{when} UTC, {args.prometheus}; {shown}"))
        panels = snap.data_panels
        line = f"{path}: {len(panels)} panels, {len(snap.empty)} without data"
        if snap.empty:
            line += f" ({'; '.join(snap.empty)})"
        print(line)
        for failure in snap.failed:
            print(f"{path}: query error: {failure}", file=sys.stderr)
            failed = True
    return 1 if failed else 0
