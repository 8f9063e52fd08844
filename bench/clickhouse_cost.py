"""The sidecar's CPU per request with the ClickHouse exporter on vs off (microseconds).

Measured like ``bench.exporter_cost`` (the same synthetic finished request and
the same ``measure``): the exporter's ``export()`` on the event loop, and the
process CPU per request including its sender thread, which builds the
``JSONEachRow`` lines and POSTs them to a real ``clickhouse-server`` started
here on loopback (its own CPU is another process's and is not counted). With
the exporter off the sidecar does none of this, so "total CPU" is the
difference between on and off.

    .venv/bin/python -m bench.clickhouse_cost --requests 20000
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from bench.exporter_cost import TOKENS, measure
from obs.clickhouse.schema import TableSpec, init
from obs.clickhouse.testing import ClickHouseServer
from obs.exporters.clickhouse import ClickHouseExporter


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.clickhouse_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--out", type=Path, default=Path("bench/results/clickhouse_cost.json"))
    args = ap.parse_args(argv)
    n = args.requests
    work = Path(tempfile.mkdtemp(prefix="vllm-obs-clickhouse-cost-"))
    server = ClickHouseServer(work / "server").start()
    try:
        client = server.client()
        spec = TableSpec("bench", "events")
        init(client, spec)
        exporter = ClickHouseExporter(client, spec.name, work / "spool.jsonl")
        row = measure("clickhouse", exporter.export, exporter.force_flush, n)
        exporter.shutdown()
        stored = server.client().rows(f"SELECT count() AS n FROM {spec.name}")[0]["n"]
        spooled = exporter.spooled_bytes
    finally:
        server.stop()
    result = {"requests": n, "tokens": TOKENS, "clickhouse": row, "rows_stored": stored}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print("| exporter | on the event loop (us/request) | total CPU (us/request) |")
    print("|---|---|---|")
    print(f"| clickhouse | {row['on_loop_us']:.1f} | {row['total_cpu_us']:.1f} |")
    print(f"rows stored {stored} of {n + n // 10} exported; spool left {spooled} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
