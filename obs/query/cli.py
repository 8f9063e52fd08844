"""``vllm-obs query``: postmortem questions over request logs, from the shell.

Only argparse runs at import; each handler imports what it needs (DuckDB,
and matplotlib for ``report``) so unrelated commands start fast.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from obs.query.schema import GROUP_BY, TIMINGS
from obs.query.table import printable as _printable

FILTER_HELP = (
    "Times are ISO 8601 (2025-06-02T14:30, ...Z or +02:00; no offset = UTC) or relative to "
    "now (30m, 2h, 1d). Lane/pool/model/tenant/status take several values, repeated or "
    "comma-separated."
)


def _common(p: argparse.ArgumentParser, paths: bool = True, fmt: bool = True) -> None:
    if paths:
        p.add_argument(
            "paths",
            nargs="+",
            metavar="LOG",
            help="JSONL files (rotated, .gz), quoted globs, or directories / Parquet datasets; "
            "or one clickhouse://HOST:8123/DB.TABLE (credentials from CLICKHOUSE_USER and "
            "CLICKHOUSE_PASSWORD; see docs/fleet.md)",
        )
    f = p.add_argument_group("filters", FILTER_HELP)
    f.add_argument("--since", metavar="TIME", help="only events at or after TIME")
    f.add_argument("--until", metavar="TIME", help="only events before TIME")
    for dim in ("lane", "pool", "model", "tenant", "status"):
        f.add_argument(f"--{dim}", action="append", metavar=dim.upper(), help=f"only this {dim}")
    if fmt:
        p.add_argument(
            "--format",
            choices=("table", "json", "csv", "markdown"),
            default="table",
            help="output format (default: table)",
        )
    p.add_argument("--no-progress", action="store_true", help="never draw the progress line")


def _config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        metavar="FILE",
        help="lanes/SLO config for SLO attainment and goodput (default: the shipped default)",
    )


def add_parser(subparsers: Any) -> None:
    q = subparsers.add_parser(
        "query",
        help="postmortem queries over request logs (summary, slowest, timeline, report, ...)",
        description="Postmortem queries over request event logs (JSONL or Parquet).",
    )
    sub = q.add_subparsers(dest="query_command", metavar="QUERY", required=True)

    p = sub.add_parser("summary", help="per-lane rates, percentiles, SLO attainment, goodput")
    _common(p)
    _config_arg(p)
    p.add_argument(
        "--by",
        choices=GROUP_BY,
        default="lane",
        metavar="FIELD",
        help=f"one column per value of FIELD: {', '.join(GROUP_BY)} (default: lane)",
    )
    p.set_defaults(handler=_summary)

    p = sub.add_parser("slowest", help="the slowest requests by a timing, with their phases")
    _common(p)
    p.add_argument("--by", default="e2e", choices=list(TIMINGS), help="timing to rank by")
    p.add_argument("-n", type=int, default=10, help="how many (default 10)")
    p.set_defaults(handler=_slowest)

    p = sub.add_parser("show", help="one request's full event and a phase waterfall")
    p.add_argument("request_id", metavar="ID", help="request id, trace id, or a unique id prefix")
    _common(p, fmt=False)
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(handler=_show)

    p = sub.add_parser("timeline", help="per-interval rates and percentiles")
    _common(p)
    _config_arg(p)
    p.add_argument("--interval", metavar="DUR", help="interval length, e.g. 1m (default: auto)")
    p.add_argument("--by", choices=GROUP_BY, metavar="FIELD", help="one series per value of FIELD")
    p.set_defaults(handler=_timeline)

    p = sub.add_parser(
        "compare",
        help="two logs or two windows side by side, with significance tests",
        description=(
            "Compare BEFORE and AFTER logs, or two windows of one log "
            "(--before and --after), or, with --around-changes, the windows either side "
            "of each settings change the log records. Rates use a two-proportion z-test, "
            "latency percentiles a Mann-Whitney U test on the timing's distribution."
        ),
    )
    p.add_argument("logs", nargs="+", metavar="LOG", help="one log (with windows) or BEFORE AFTER")
    _common(p, paths=False)
    _config_arg(p)
    p.add_argument("--before", metavar="START..END", help="window of the first side")
    p.add_argument("--after", metavar="START..END", help="window of the second side")
    p.add_argument(
        "--around-changes",
        action="store_true",
        help="find each change of a pool's settings or config fingerprint in the log and "
        "compare the window before it with the window after it (same length, bounded by "
        "the pool's neighbouring changes); see docs/runbook.md, After a tuning change",
    )
    p.add_argument(
        "--prometheus",
        metavar="URL",
        help="with --around-changes: the Prometheus that scraped the sidecar, to say what each "
        "settings fingerprint stands for (prefix_caching=false -> prefix_caching=true)",
    )
    p.add_argument("--alpha", type=float, default=0.01, help="significance level (default 0.01)")
    p.set_defaults(handler=_compare)

    p = sub.add_parser(
        "canary",
        help="a split lane's canary arm against its baseline: promote, hold or roll back",
        description=(
            "Compare each canary arm of the split lane named by --lane (its lighter arms) "
            "with the baseline arm (its heaviest) using the tests of `query compare`, and "
            "say promote, hold or roll back by the lane's canary margins (default: p95 TTFT "
            "or TPOT more than 15% worse beyond noise, or availability below the lane's "
            "objective, rolls back; fewer than min_requests per arm holds). See "
            "docs/lanes.md."
        ),
    )
    _common(p)
    _config_arg(p)
    p.add_argument(
        "--window",
        metavar="DUR",
        help="only the last DUR of the log (e.g. 1h), ending at its newest event",
    )
    p.add_argument("--alpha", type=float, default=0.01, help="significance level (default 0.01)")
    p.set_defaults(handler=_canary)

    p = sub.add_parser(
        "budget",
        help="where each lane's error budget went: by phase, cause, replica, tenant, model",
        description=(
            "Per lane and SLO: the error budget spent in the window, split by the phase and "
            "cause each miss is charged to (the rule: docs/query.md, Where the error budget "
            "went), the replicas, tenants and models behind the misses, and the worst misses "
            "with the `vllm-obs query show` command for each."
        ),
    )
    _common(p, fmt=False)
    _config_arg(p)
    p.add_argument(
        "--window",
        metavar="DUR",
        help="only the DUR (1h, 6h, 3d: an alert's window) that ends with the newest event "
        "(or at --until); default: every event the filters select",
    )
    p.add_argument("--format", choices=("table", "json", "markdown"), default="table")
    p.set_defaults(handler=_budget)

    p = sub.add_parser("incident", help="the postmortem's first draft, in words (docs/query.md)")
    _common(p)  # --format json: the draft as data; any other: in words
    _config_arg(p)
    p.add_argument("--prometheus", metavar="URL", help="read the alerts that fired from it")
    p.set_defaults(handler=_budget, window=None)

    p = sub.add_parser("report", help="self-contained HTML report with plots")
    _common(p, fmt=False)
    _config_arg(p)
    p.add_argument("--out", "-o", required=True, metavar="DIR", help="directory to write into")
    p.add_argument("--title", help="report title")
    p.set_defaults(handler=_report)

    p = sub.add_parser("export", help="write events as Parquet partitioned by date and lane")
    _common(p, fmt=False)
    p.add_argument("--out", "-o", required=True, metavar="DIR", help="dataset directory")
    p.add_argument("--append", action="store_true", help="add to an existing dataset")
    p.set_defaults(handler=_export)


def _filters(args: argparse.Namespace) -> Any:
    from obs.query.filters import Filters

    return Filters.parse(
        args.since, args.until, args.lane, args.pool, args.model, args.tenant, args.status
    )


def _config(args: argparse.Namespace) -> Any:
    from obs.config import default_config_path, load_config

    return load_config(args.config or default_config_path())


def _scan(args: argparse.Namespace, paths: list[str] | None = None, filters: Any = None) -> Any:
    from obs.query.api import open_any

    items = paths or args.paths
    if filters is None:  # the command's own filters: refuse a name nothing knows
        filters = _known(args, items, _filters(args))
    return open_any(items, filters, _progress(args))


def _known(args: argparse.Namespace, paths: list[str], filters: Any, con: Any = None) -> Any:
    """``filters``, once every lane, pool, model and tenant in them is one the logs or the
    config (commands with --config) knows; else exit 2 naming the known ones."""
    from obs.query.api import open_any
    from obs.query.known import check

    config = _config(args) if hasattr(args, "config") else None
    check(filters, lambda f: open_any(paths, f, False, con), config)
    return filters


def _progress(args: argparse.Namespace) -> bool | None:
    return False if args.no_progress else None


def _warn(*scans: Any) -> None:
    for scan in scans:
        for msg in scan.report.messages():
            print(f"vllm-obs query: warning: {msg}", file=sys.stderr)


def _emit(text: str, args: argparse.Namespace | None = None) -> None:
    """Write an answer; in words (table or text), its lines wrapped to the terminal's width
    (tables are fitted when rendered; this wraps prose: headings, verdicts, sentences)."""
    if args is not None and getattr(args, "format", "table") == "table":
        from obs.query.terminal import wrap

        text = wrap(text)
    sys.stdout.write(_printable(text, keep="\n\t"))  # no client string drives the terminal
    sys.stdout.flush()


def _summary(args: argparse.Namespace) -> int:
    from obs.query.aggregate import summary
    from obs.query.table import render

    config = _config(args)
    scan = _scan(args)
    table = summary(scan, config, args.by)
    return _out(args, render(table, args.format, transpose=True), scan)


def _slowest(args: argparse.Namespace) -> int:
    from obs.query.requests import slowest
    from obs.query.table import render

    scan = _scan(args)
    return _out(args, render(slowest(scan, args.by, args.n), args.format), scan)


def _show(args: argparse.Namespace) -> int:
    from obs.query.requests import as_json, describe, find
    from obs.query.table import to_json

    scan = _scan(args)
    event = find(scan, args.request_id)
    return _out(args, to_json(as_json(event)) if args.format == "json" else describe(event), scan)


def _timeline(args: argparse.Namespace) -> int:
    from obs.query.intervals import timeline
    from obs.query.table import render

    config = _config(args)
    scan = _scan(args)
    return _out(args, render(timeline(scan, config, args.interval, args.by), args.format), scan)


def _window(text: str | None) -> tuple[Any, Any] | None:
    from obs.durations import parse_time
    from obs.errors import InputError

    if text is None:
        return None
    if ".." not in text:
        raise InputError(f"{text!r}: a window is START..END (either side may be empty)")
    lo, hi = text.split("..", 1)
    return (parse_time(lo) if lo.strip() else None, parse_time(hi) if hi.strip() else None)


def _compare(args: argparse.Namespace) -> int:
    from obs.errors import InputError
    from obs.query.api import open_any
    from obs.query.comparison import compare, for_display
    from obs.query.filters import Filters
    from obs.query.scan import connect
    from obs.query.table import render

    if args.around_changes:
        return _around_changes(args)
    if args.prometheus:
        raise InputError("--prometheus goes with --around-changes")
    if len(args.logs) > 2:
        raise InputError("compare takes one log (with --before/--after windows) or two logs")
    before_w, after_w = _window(args.before), _window(args.after)
    if len(args.logs) == 1 and not (before_w and after_w):
        raise InputError("with one log, give both windows: --before START..END --after START..END")
    con = connect()
    base = _known(args, args.logs, _filters(args), con)
    fb: Filters = base.with_window(*before_w) if before_w else base
    fa: Filters = base.with_window(*after_w) if after_w else base
    progress = _progress(args)
    before = open_any([args.logs[0]], fb, progress, con)
    after = open_any([args.logs[-1]], fa, progress, con)
    table = compare(before, after, _config(args), args.alpha)
    shown = for_display(table) if args.format in ("table", "markdown") else table
    return _out(args, render(shown, args.format), before, after)


def _around_changes(args: argparse.Namespace) -> int:
    from obs.errors import InputError
    from obs.query.api import open_any
    from obs.query.changes import around_changes, describe_verdicts, verdicts
    from obs.query.comparison import for_display
    from obs.query.scan import connect
    from obs.query.table import Table, render

    if len(args.logs) != 1 or args.before or args.after:
        raise InputError("--around-changes takes one log and no --before/--after windows")
    describe = None
    if args.prometheus:
        import time

        from obs.query.settings_names import describer

        describe = describer(args.prometheus, time.time())
    con = connect()
    progress = _progress(args)
    scan = open_any(args.logs, _known(args, args.logs, _filters(args), con), progress, con)
    config = _config(args)
    table = around_changes(
        scan, lambda f: open_any(args.logs, f, progress, con), _filters(args), config,
        args.alpha, describe,
    )  # fmt: skip
    if not table.rows:
        print("vllm-obs query: no settings change in the log", file=sys.stderr)
    text = ""
    if args.format in ("table", "markdown") and table.rows:
        text = describe_verdicts(verdicts(table, config))
        n = len(table.columns) - 9
        shown = for_display(Table(table.columns[n:], [r[n:] for r in table.rows]))
        heads = [tuple(map(str, r[:n])) for r in table.rows]
        table = Table(table.columns, [h + r for h, r in zip(heads, shown.rows, strict=True)])
    out = render(table, args.format)
    return _out(args, out + "\n" + text if text else out, scan)


def _canary(args: argparse.Namespace) -> int:
    from obs.errors import InputError
    from obs.query.api import open_any
    from obs.query.canary import canary, render_verdicts
    from obs.query.error_budget import window_filters
    from obs.query.scan import connect

    con = connect()
    lanes = _known(args, args.paths, _filters(args), con).lanes
    if len(lanes) != 1:
        raise InputError("canary: name one split lane with --lane LANE")
    progress = _progress(args)

    def scan(f: Any) -> Any:
        return open_any(args.paths, f, progress, con)

    filters = _filters(args)
    if args.window:
        filters = window_filters(scan(filters), args.window)  # ClickHouse's ts_ms too
    _emit(
        render_verdicts(canary(scan, filters, _config(args), lanes[0], args.alpha), args.format),
        args,
    )
    return 0


def _budget(args: argparse.Namespace) -> int:  # budget, and incident (its first draft)
    from obs.query import error_budget, incident

    scan = _scan(args)
    windowed = error_budget.window_filters(scan, args.window)
    if windowed is not scan.filters:
        scan = _scan(args, filters=windowed)
    config, paths = _config(args), list(args.paths)
    if args.query_command == "incident":
        return _out(args, incident.text(scan, config, paths, args.prometheus, args.format), scan)
    return _out(
        args, error_budget.render(error_budget.budget(scan, config, paths), args.format), scan
    )


def _report(args: argparse.Namespace) -> int:
    from obs.query.html_report import report

    config = _config(args)
    scan = _scan(args)
    path = report(scan, config, args.out, args.title)
    _warn(scan)
    print(f"wrote {path} (and the figures as PNG beside it)", file=sys.stderr)
    return 0


def _export(args: argparse.Namespace) -> int:
    from obs.query.parquet import export

    scan = _scan(args)
    result = export(scan, args.out, args.append)
    _warn(scan)
    print(f"wrote {result['events']} events to {result['out']} ({result['files']} files)")
    return 0


def _out(args: argparse.Namespace, text: str, *scans: Any) -> int:
    """Print a command's answer, then the scans' warnings; the exit status."""
    _emit(text, args)
    _warn(*scans)
    return 0
