"""``vllm-obs query summary`` against a raw DuckDB scan of the same JSONL file, in one run.

The raw scan is what a user would type to read the file with DuckDB alone (``SELECT
count(*) FROM read_json(FILE)``: every line parsed, schema detected), in a fresh
interpreter like the summary. The two commands alternate, ``--repeat`` times each, so a
busy machine slows both alike. Two figures: the median of the paired ratios (each summary
over the raw scan run right after it: the load they met is the most alike) and the ratio of
the two medians (issue 42 item 4: the summary within 1.5x of the raw scan; ``--check``
judges the paired one). The children's CPU time (user+sys) is recorded too: on a shared
machine it moves less with the load than wall time does.

    .venv/bin/python -m bench.query_vs_scan              # 600k events, 5 rounds
    .venv/bin/python -m bench.query_vs_scan --check      # exit 1 above 1.5x

The log is ``bench/query_bench.py``'s synthetic one (cached in ``--workdir``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from bench.query_bench import generate_jsonl, in_fresh_process, run_child

TARGET_RATIO = 1.5


def raw_command(path: Path) -> list[str]:
    sql = f"SELECT count(*) FROM read_json('{path}', format = 'newline_delimited')"
    code = f"import duckdb; duckdb.sql({sql!r}).fetchall()"
    return [sys.executable, "-c", code]


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=600_000)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/vllm-obs-bench"))
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--check", action="store_true", help="exit 1 above the target ratio")
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--vllm-obs", help="the vllm-obs to measure (default: this interpreter's)")
    args = p.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    log = args.workdir / f"events-{args.events}.jsonl"
    if not log.exists():
        t0 = time.perf_counter()
        in_fresh_process(generate_jsonl, log, args.events)
        print(f"generated {log} in {time.perf_counter() - t0:.1f} s")
    exe = args.vllm_obs or shutil.which("vllm-obs", path=str(Path(sys.executable).parent))
    exe = exe or "vllm-obs"
    commands = {"summary": [exe, "query", "summary", str(log)], "raw": raw_command(log)}
    walls: dict[str, list[float]] = {k: [] for k in commands}
    cpus: dict[str, list[float]] = {k: [] for k in commands}
    load_before = os.getloadavg()[0]
    for _ in range(args.repeat):
        for name, cmd in commands.items():
            wall, cpu, _rss, rc = run_child(cmd)
            if rc:
                raise SystemExit(f"{name}: command failed: {' '.join(cmd)}")
            walls[name].append(wall)
            cpus[name].append(cpu)
    s, r = median(walls["summary"]), median(walls["raw"])
    ratio = s / r
    paired = median([a / b for a, b in zip(walls["summary"], walls["raw"], strict=True)])
    cpu_ratio = median(cpus["summary"]) / median(cpus["raw"])
    ok = paired <= TARGET_RATIO
    print(
        f"{args.events} events: query summary median {s:.2f} s, raw DuckDB scan median "
        f"{r:.2f} s over {args.repeat} alternating runs: paired ratio median {paired:.2f}x, "
        f"ratio of medians {ratio:.2f}x (target <= {TARGET_RATIO}x) -> "
        f"{'OK' if ok else 'MISSED'}"
    )
    print(
        f"  CPU (user+sys) medians: summary {median(cpus['summary']):.2f} s, raw "
        f"{median(cpus['raw']):.2f} s ({cpu_ratio:.2f}x); load average {load_before:.1f} "
        f"before, {os.getloadavg()[0]:.1f} after, {os.cpu_count()} CPUs"
    )
    print(f"  summary: {' '.join(commands['summary'])}")
    print(f"  raw:     {' '.join(commands['raw'])}")
    if args.json:
        doc = {"events": args.events, "summary_s": walls["summary"], "raw_s": walls["raw"]}
        doc |= {"summary_cpu_s": cpus["summary"], "raw_cpu_s": cpus["raw"]}
        figures = {
            "paired_ratio": round(paired, 3),
            "ratio_of_medians": round(ratio, 3),
            "cpu_ratio_of_medians": round(cpu_ratio, 3),
        }
        run = {
            "command": " ".join(["python", "-m", "bench.query_vs_scan", *(argv or sys.argv[1:])]),
            "cpus": os.cpu_count(),
            "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        }
        args.json.write_text(json.dumps({**doc, **figures, **run}, indent=2) + "\n")
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
