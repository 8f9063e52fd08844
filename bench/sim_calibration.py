"""The simulator against published measurements of real vLLM (docs/sim.md, "Calibration").

Each case replays a published benchmark's workload on one simulated replica in
virtual time: ``vllm bench serve``-style closed loop (``concurrency`` clients, each
sending its next request when the last one ends; fixed input and output lengths,
random prompts so no prefix-cache hits) and compares the simulator's output
throughput and mean TTFT with the published figures. The replica has vLLM's API server
in front of it (obs.engines.sim.frontend, its costs from the sources docs/sim.md cites);
each row also gives the mean TTFT without it, and the share of the run it was busy.

    python -m bench.sim_calibration --out bench/results/sim_calibration.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from obs.engines.sim.frontend import FrontEnd
from obs.engines.sim.hardware import perf_model
from obs.engines.sim.scheduler import SchedulerConfig, SimRequest
from obs.sweep.virtual import VirtualLoop, VirtualReplica

LIMIT = 0.25  # the bar: each figure within 25% of the published one


@dataclass(frozen=True, slots=True)
class Case:
    source: str
    gpu: str
    model: str
    input_tokens: int
    output_tokens: int
    concurrency: int
    prompts: int
    output_tok_s: float | None  # published output throughput
    ttft_ms: float | None  # published mean TTFT
    spread: float = 0.0  # output lengths uniform in output_tokens x (1 +- spread)
    median_ttft_ms: float | None = None  # published median TTFT (shown, not judged)


MUSGRAVE = "https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on"
RAHMAN = "https://mushfiqrahman.dev/?p=1668"
CASES = (
    # A100 40GB, Llama-3.1-8B-Instruct BF16, vLLM 0.23, 1024 in / 128 out, one request at a
    # time: "decode at one request per time runs at about 75 tokens/sec".
    Case(MUSGRAVE, "A100-40GB", "llama-3.1-8b", 1024, 128, 1, 20, 75.0, None),
    # RTX 4090, Mistral-7B-Instruct-v0.3, 256 in / 128 out, 300 prompts, rate inf,
    # --max-concurrency C: output tok/s, mean and median TTFT from the published table.
    # No --ignore-eos there: answers end at end-of-sequence, so their lengths vary; the
    # simulator draws them uniform in 128 x (1 +- 0.5), an assumption (docs/sim.md).
    Case(RAHMAN, "RTX4090", "mistral-7b", 256, 128, 4, 300, 210.0, 63.0, 0.5, 53.0),
    Case(RAHMAN, "RTX4090", "mistral-7b", 256, 128, 8, 300, 377.0, 79.0, 0.5, 55.0),
    Case(RAHMAN, "RTX4090", "mistral-7b", 256, 128, 16, 300, 644.0, 155.0, 0.5, 97.0),
    Case(RAHMAN, "RTX4090", "mistral-7b", 256, 128, 32, 300, 975.0, 362.0, 0.5, 277.0),
    Case(RAHMAN, "RTX4090", "mistral-7b", 256, 128, 48, 300, 1190.0, 667.0, 0.5, 840.0),
)


def simulate(case: Case, api_server: bool = True) -> dict[str, float]:
    """The simulator's output throughput (tok/s), mean TTFT and mean ITL (ms) for ``case``,
    and the API server's busy share (0 without one)."""
    loop = VirtualLoop()
    frontend = FrontEnd() if api_server else None
    perf = perf_model(case.gpu, case.model)
    replica = VirtualReplica(loop, perf, SchedulerConfig(), frontend=frontend)
    counter = itertools.count()
    done: list[SimRequest] = []
    rng = random.Random(f"calibration:{case.gpu}:{case.concurrency}")
    low = round(case.output_tokens * (1 - case.spread))
    high = round(case.output_tokens * (1 + case.spread))

    async def client() -> None:
        while (i := next(counter)) < case.prompts:
            req = SimRequest(f"c{i}", case.input_tokens, rng.randint(low, high))
            await replica.submit(req)
            done.append(req)

    async def run() -> None:
        await asyncio.gather(*(client() for _ in range(case.concurrency)))

    loop.run_until_complete(run())
    loop.close()
    span = max(r.finished_s or 0.0 for r in done) - min(r.arrival_s for r in done)
    ttft = sorted((r.first_token_s or 0.0) - r.arrival_s for r in done)
    itl = [((r.finished_s or 0.0) - (r.first_token_s or 0.0)) / max(1, r.output - 1) for r in done]
    return {
        "output_tok_s": sum(r.output for r in done) / span,
        "ttft_ms": 1000 * sum(ttft) / len(ttft),
        "median_ttft_ms": 1000 * statistics.median(ttft),
        "itl_ms": 1000 * sum(itl) / len(itl),
        "api_server_busy": 0.0 if frontend is None else frontend.busy_s / span,
    }


def _ratio(sim: float, real: float | None) -> float | None:
    return None if real is None else sim / real


def table(cases: tuple[Case, ...] = CASES) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for case in cases:
        sim = simulate(case)
        engine_only = simulate(case, api_server=False)
        # One request at a time: the published figure is the decode rate (1 / ITL).
        tok_s = 1000 / sim["itl_ms"] if case.concurrency == 1 else sim["output_tok_s"]
        rows.append(
            {
                "source": case.source,
                "gpu": case.gpu,
                "model": case.model,
                "workload": f"{case.input_tokens} in / {case.output_tokens} out, "
                f"concurrency {case.concurrency}",
                "published_output_tok_s": case.output_tok_s,
                "sim_output_tok_s": round(tok_s, 1),
                "output_ratio": _ratio(tok_s, case.output_tok_s),
                "published_ttft_ms": case.ttft_ms,
                "sim_ttft_ms": round(sim["ttft_ms"], 1),
                "ttft_ratio": _ratio(sim["ttft_ms"], case.ttft_ms),
                "published_median_ttft_ms": case.median_ttft_ms,
                "sim_median_ttft_ms": round(sim["median_ttft_ms"], 1),
                "sim_ttft_ms_without_api_server": round(engine_only["ttft_ms"], 1),
                "sim_api_server_busy": round(sim["api_server_busy"], 3),
            }
        )
    for r in rows:
        ratios = [x for x in (r["output_ratio"], r["ttft_ratio"]) if x is not None]
        r["within_25pct"] = all(abs(x - 1) <= LIMIT for x in ratios)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="write the table here (JSON)")
    args = p.parse_args(argv)
    rows = table()
    for r in rows:
        print(json.dumps(r))
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
