"""A canary walk-through on the demo's pools (docs/runbook.md, "Canary walk-through").

Starts the demo's two vLLM pools (``obs.demo.options.LOCAL_POOLS``: interactive, bulk),
writes the shipped lanes with the chat lane split between them (interactive the
baseline, bulk the canary: the same model on other scheduler settings), sticky per load
session (``auth.tenant_header: x-vllm-obs-session`` makes each session a tenant), runs
``vllm-obs demo --config`` on them (sidecar, load, report), then ``vllm-obs query canary``
on its events, and writes the command lines and the verdict to
``bench/results/canary_walkthrough.txt``. Heavy (two engines): run it under the heavy lock.

    .venv/bin/python -m bench.canary_walkthrough --duration 150 --weights 80,20
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import yaml

from obs.demo.options import LOCAL_POOLS
from obs.demo.stack import local_pools
from obs.demo.workload import write_lanes
from obs.engines.setup import ensure_engine

RESULT = Path(__file__).parent / "results" / "canary_walkthrough.txt"


def split_config(path: Path, urls: dict[str, list[str]], weights: tuple[int, int]) -> None:
    write_lanes(path, urls)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    chat = next(lane for lane in data["lanes"] if lane["name"] == "chat")
    del chat["pool"]
    chat["split"] = {"interactive": weights[0], "bulk": weights[1]}
    chat["canary"] = {"sticky": "tenant", "min_requests": 20}
    data["auth"] = {"tenant_header": "x-vllm-obs-session"}
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def _run(cmd: list[str], log: list[str]) -> str:
    log.append("$ " + " ".join(cmd))
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800)
    log.append(out.stdout.rstrip())
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}")
    return out.stdout


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=150, help="seconds of load")
    p.add_argument("--rate", type=float, default=4, help="sessions per second")
    p.add_argument("--weights", default="80,20", help="interactive,bulk weights of chat")
    p.add_argument("--out", type=Path, default=Path("canary-walkthrough"), help="output dir")
    args = p.parse_args(argv)
    weights = tuple(int(w) for w in args.weights.split(","))
    assert len(weights) == 2, "--weights BASELINE,CANARY"
    args.out.mkdir(parents=True, exist_ok=True)
    paths = ensure_engine(progress=lambda m: print(f"[engine] {m}", flush=True))
    servers = local_pools(paths, args.out)
    try:
        for s in servers:
            s.start()
        urls = {spec.name: [s.url] for spec, s in zip(LOCAL_POOLS, servers, strict=True)}
        config = args.out / "split.yaml"
        split_config(config, urls, (weights[0], weights[1]))
        vo = [sys.executable, "-m", "obs.cli"]
        log: list[str] = []
        demo = args.out / "demo"
        _run(
            [
                *vo,
                "demo",
                "--config",
                str(config),
                "--out",
                str(demo),
                "--no-prometheus",
                "--duration",
                f"{args.duration:g}",
                "--rate",
                f"{args.rate:g}",
            ],
            [],
        )
        log.append(
            f"# chat split interactive {weights[0]} / bulk {weights[1]}, "
            f"{args.duration:g} s of the demo mix at {args.rate:g} sessions/s"
        )
        events = str(demo / "events.jsonl")
        _run(
            [
                *vo,
                "query",
                "canary",
                events,
                "--lane",
                "chat",
                "--config",
                str(config),
                "--no-progress",
            ],
            log,
        )
        text = "\n".join(log) + "\n"
        RESULT.write_text(text, encoding="utf-8")
        print(text)
    finally:
        for s in servers:
            s.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
