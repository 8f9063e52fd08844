"""Peak memory of ``vllm-obs plan`` on a large event log (issue 42: bounded memory on 10M events).

Generates ``bench/query_bench.py``'s synthetic log as a Parquet dataset (the six default lanes
over seven days, laid out as ``query export`` writes it; cached in ``--workdir``), then runs
``vllm-obs plan DATASET --config obs/data/lanes.yaml`` once in a fresh process and records its
wall time, CPU time and peak RSS (``os.wait4``'s rusage of the child: what ``/usr/bin/time -v``
calls "Maximum resident set size").

    .venv/bin/python -m bench.plan_memory                          # 10M events
    .venv/bin/python -m bench.plan_memory --events 1000000 --json /tmp/plan_1m.json

Parquet, not JSONL: 10M events of JSONL are about 13.5 GB (the 600k file is 812 MB); the
plan reads both through the same query layer (two aggregate queries), so what grows with the
events is the scan, not what the plan holds. ``--max-requests`` bounds the replay (its own
memory does not depend on the log's size; the plan says when it replays the busiest stretch).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.query_bench import generate_parquet, in_fresh_process, run_child

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "obs" / "data" / "lanes.yaml"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=10_000_000)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/vllm-obs-bench"))
    p.add_argument("--max-requests", type=int, default=5_000)
    p.add_argument("--growth", type=float, default=1.0)
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    ds = args.workdir / f"events-{args.events}.parquet.d"
    if not ds.exists():
        t0 = time.perf_counter()
        in_fresh_process(generate_parquet, ds, args.events)
        print(f"generated {ds} in {time.perf_counter() - t0:.1f} s")
    size = sum(f.stat().st_size for f in ds.rglob("*") if f.is_file())
    exe = shutil.which("vllm-obs", path=str(Path(sys.executable).parent)) or "vllm-obs"
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            exe,
            "plan",
            str(ds),
            "--config",
            str(CONFIG),
            "--growth",
            f"{args.growth:g}",
            "--max-requests",
            str(args.max_requests),
            "--out",
            out,
            "--no-progress",
        ]
        wall, cpu, rss, rc = run_child(cmd)
        planned = (Path(out) / "plan.json").exists()
    shown = " ".join(["vllm-obs", *cmd[1:]]).replace(out, "OUT")
    shown = shown.replace(str(CONFIG), str(CONFIG.relative_to(ROOT)))
    print(
        f"{args.events} events (Parquet, {size / 1e6:.0f} MB): vllm-obs plan exit {rc}, "
        f"wall {wall:.1f} s, CPU {cpu:.1f} s, peak RSS {rss:.0f} MB"
    )
    print(f"  {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} when done")
    print(f"  command: {shown}")
    if args.json:
        doc = {
            "events": args.events,
            "format": "parquet",
            "dataset_mb": round(size / 1e6),
            "exit": rc,
            "plan_written": planned,
            "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2),
            "peak_rss_mb": round(rss),
            "command": shown,
            "cpus": os.cpu_count(),
            "load_average_after": round(os.getloadavg()[0], 1),
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if planned else 1


if __name__ == "__main__":
    sys.exit(main())
