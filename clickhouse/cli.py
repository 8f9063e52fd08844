"""``vllm-obs clickhouse``: the event table's DDL, creating/upgrading it, and backfill."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from obs.clickhouse.schema import TableSpec

_CREDS = (
    "Credentials come from CLICKHOUSE_USER and CLICKHOUSE_PASSWORD (or "
    "CLICKHOUSE_PASSWORD_FILE), never from the command line."
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "clickhouse",
        help="the ClickHouse event table: schema, init, load (backfill)",
        description="Keep request events in ClickHouse for a fleet of sidecars. " + _CREDS,
    )
    cmds = p.add_subparsers(dest="clickhouse_command", metavar="COMMAND", required=True)

    def table_args(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "--table",
            default="vllm_obs.events",
            metavar="DB.TABLE",
            help="the event table (default: %(default)s)",
        )
        q.add_argument(
            "--cluster",
            metavar="NAME",
            help="a cluster from the servers' remote_servers: DB.TABLE becomes a Distributed "
            "table over DB.TABLE_local on each shard",
        )
        q.add_argument(
            "--ttl-days", type=int, metavar="N", help="delete events older than N days (19.6+)"
        )

    s = cmds.add_parser("schema", help="print the DDL", description="Print the event table DDL.")
    table_args(s)
    s.set_defaults(handler=_schema)

    i = cmds.add_parser(
        "init",
        help="create the database and table, or add new event columns (idempotent)",
        description="Create the event table where missing and add columns newer vllm-obs "
        "releases added; with --cluster, run it against every shard. " + _CREDS,
    )
    i.add_argument("urls", nargs="+", metavar="URL", help="http://HOST:8123 of each server")
    table_args(i)
    i.set_defaults(handler=_init)

    ld = cmds.add_parser(
        "load",
        help="insert archived event logs (JSONL, .gz, Parquet); re-runs add no duplicates",
        description="Backfill event logs into the table. Bad lines are skipped and counted "
        "as `vllm-obs query` does. " + _CREDS,
    )
    ld.add_argument("url", metavar="URL", help="http://HOST:8123")
    ld.add_argument("paths", nargs="+", metavar="LOG", help="files, quoted globs, directories")
    ld.add_argument("--table", default="vllm_obs.events", metavar="DB.TABLE")
    ld.add_argument("--quiet", action="store_true", help="no progress lines")
    ld.set_defaults(handler=_load)


def _spec(args: argparse.Namespace) -> TableSpec:
    from obs.clickhouse.client import split_table
    from obs.clickhouse.schema import TableSpec

    db, table = split_table(args.table)
    return TableSpec(db, table, getattr(args, "cluster", None), getattr(args, "ttl_days", None))


def _schema(args: argparse.Namespace) -> int:
    from obs.clickhouse.schema import ddl

    print(";\n\n".join(ddl(_spec(args))) + ";")
    return 0


def _init(args: argparse.Namespace) -> int:
    from obs.clickhouse.client import Client
    from obs.clickhouse.schema import init

    spec = _spec(args)
    for url in args.urls:
        client = Client(url)
        try:
            changes = init(client, spec)
        finally:
            client.close()
        print(f"{client.url}: {spec.name} ready" + "".join(f"\n  {c}" for c in changes))
    return 0


def _load(args: argparse.Namespace) -> int:
    from obs.clickhouse.client import Client
    from obs.query.clickhouse_load import load

    client = Client(args.url, timeout_s=300.0)

    def progress(msg: str) -> None:
        print(f"\r{msg}", end="", file=sys.stderr, flush=True)

    try:
        result = load(client, _spec(args), args.paths, progress=None if args.quiet else progress)
    finally:
        client.close()
    if not args.quiet:
        print(file=sys.stderr)
    scan = result.scan
    print(
        f"inserted {result.inserted:,} events into {args.table} in {result.seconds:.1f} s; "
        f"skipped {scan['malformed_total']} malformed and {len(scan['truncated'])} truncated "
        f"line(s), {result.skipped_bad_ts} without a valid ts"
    )
    for f, n in sorted(scan["malformed"].items()):
        if n:
            print(f"  {f}: {n} malformed line(s) skipped", file=sys.stderr)
    return 0
