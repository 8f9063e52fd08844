"""Insert and summarise N synthetic events: ClickHouse vs DuckDB on local Parquet.

Generates the query benchmark's realistic log (``bench.query_bench``) as a
Parquet dataset laid out like ``query export`` (cached in ``--workdir``), then:

  duckdb summary     ``vllm-obs query summary DATASET`` in a fresh process
  clickhouse load    ``vllm-obs clickhouse load URL DATASET`` into a fresh
                     ``clickhouse-server`` started here on loopback (the
                     backfill path: rows read by DuckDB, sent as JSONEachRow)
  clickhouse summary ``vllm-obs query summary clickhouse://...`` (the server
                     aggregates; the client gets per-lane rows)

and checks that both summaries count the same requests per lane. Wall times
are medians over ``--repeat`` runs; CPU is the client process's (the server's
own CPU is measured apart, from /proc). The issue's size is 10 million events (``--events
10000000``); on a small shared machine run fewer and say so.

    .venv/bin/python -m bench.clickhouse_query --events 1000000
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.query_bench import generate_parquet, in_fresh_process, run_child
from obs.clickhouse.schema import TableSpec, init
from obs.clickhouse.testing import ClickHouseServer


def _server_cpu_s(pid: int | None) -> float:
    """User + system CPU seconds the server process has used so far (0 without one)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timed(label: str, cmd: list[str], repeat: int, server: int | None = None) -> dict[str, float]:
    cpu0 = _server_cpu_s(server)
    runs = [run_child(cmd) for _ in range(repeat)]
    server_cpu = (_server_cpu_s(server) - cpu0) / repeat
    if any(rc for *_, rc in runs):
        raise SystemExit(f"{label}: command failed: {' '.join(cmd)}")
    walls = sorted(r[0] for r in runs)
    cpus = sorted(r[1] for r in runs)
    row = {
        "wall_s": walls[len(walls) // 2],
        "client_cpu_s": cpus[len(cpus) // 2],
        "peak_rss_mb": max(r[2] for r in runs),
        "server_cpu_s": server_cpu,
    }
    print(
        f"{label:20s} wall {row['wall_s']:8.2f} s  client CPU {row['client_cpu_s']:7.2f} s  "
        f"server CPU {server_cpu:7.2f} s  peak RSS {row['peak_rss_mb']:6.0f} MB   "
        f"({' '.join(cmd)})",
        flush=True,
    )
    return row


def _requests(exe: str, source: str) -> dict[str, str]:
    out = subprocess.run(
        [exe, "query", "summary", source, "--format", "csv", "--no-progress"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {r["lane"]: r["requests"] for r in csv.DictReader(io.StringIO(out))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.clickhouse_query",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--events", type=int, default=10_000_000, help="events (default 10000000)")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/vllm-obs-bench"))
    p.add_argument("--repeat", type=int, default=3, help="summary runs per engine")
    p.add_argument("--out", type=Path, default=Path("bench/results/clickhouse_query.json"))
    args = p.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    exe = shutil.which("vllm-obs", path=str(Path(sys.executable).parent)) or "vllm-obs"
    dataset = args.workdir / f"parquet-{args.events}"
    if not dataset.exists():
        t0 = time.perf_counter()
        in_fresh_process(generate_parquet, dataset, args.events)
        print(f"generated {dataset} in {time.perf_counter() - t0:.1f} s", flush=True)
    results: dict[str, object] = {"events": args.events}
    results["duckdb_summary"] = _timed(
        "duckdb summary", [exe, "query", "summary", str(dataset), "--no-progress"], args.repeat
    )
    server_dir = args.workdir / "clickhouse-server"
    shutil.rmtree(server_dir, ignore_errors=True)
    server = ClickHouseServer(server_dir).start()
    try:
        spec = TableSpec("bench", "events")
        init(server.client(), spec)
        load = [exe, "clickhouse", "load", server.url, str(dataset), "--table", spec.name]
        results["clickhouse_load"] = _timed("clickhouse load", [*load, "--quiet"], 1, server.pid)
        url = f"clickhouse://{server.url.removeprefix('http://')}/{spec.name}"
        results["clickhouse_summary"] = _timed(
            "clickhouse summary",
            [exe, "query", "summary", url, "--no-progress"],
            args.repeat,
            server.pid,
        )
        same = _requests(exe, url) == _requests(exe, str(dataset))
        results["same_requests_per_lane"] = same
        print(f"requests per lane equal on both engines: {same}")
    finally:
        server.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if results["same_requests_per_lane"] else 1


if __name__ == "__main__":
    sys.exit(main())
