"""The simulator against published measurements of real vLLM, fitted on some and scored on others.

Every point is one published figure of one benchmark run (docs/sim.md, "Calibration",
cites each). Which points are **fit** points and which are **held out** was decided
before any point was scored, by source and run, and is fixed in :data:`CASES`:

- fit: the RTX 4090 curve (concurrency 4-48, throughput and mean TTFT), the A100's
  one-request decode rate, and the vLLM CI latency runs on H200 (Llama-3.1-8B TP1 and
  Llama-3-70B TP4): the points the efficiencies had already been set from, and the one
  source with tensor parallelism on the fit side;
- held out: everything else found: the vLLM CI latency runs on H100 (8B TP1, 70B TP4)
  and A100 (8B), Lambda's H100 runs (Mistral-7B TTFT, TPOT and throughput; Llama-3.1-70B
  FP8 on 4 H100s, TPOT), and the A100 source's concurrency-8 throughput.

``--fit`` searches the calibration (hardware.Calibration: mfu, mbu, the CPU's costs per
step, sequence and token, the all-reduce latency) that minimises the mean absolute log
error over the fit points only, and prints it; the committed values in
obs/engines/sim/hardware.py are its result. Without ``--fit`` the committed calibration
is scored: fit and held-out errors are printed separately, and ``--out`` writes one
entry per point (source, GPU, model, workload, published and simulated value, their
ratio, ``held_out``).

Workloads, replayed on one simulated replica in virtual time:

- ``closed``: ``vllm bench serve --max-concurrency C --request-rate inf``, fixed input,
  output ``output_tokens x (1 +- spread)``, random prompts (no prefix-cache hits), the
  API server's CPU in front (obs.engines.sim.frontend);
- ``batch``: vLLM's CI latency test (``benchmark_latency.py``: 8 prompts of 32 tokens
  generated together to 128 tokens, offline, no API server): the batch's end-to-end time;
- ``replay``: a ``benchmark_serving.py`` run with ``--request-rate inf`` whose per-request
  input and output lengths are published (Lambda's JSON results): the same lengths,
  all sent at once, the API server in front; ``benchmark_serving``'s accounting (a request
  with no output counts TTFT 0; TPOT over requests with more than one token).

    python -m bench.sim_calibration --out bench/results/sim_calibration.json
    python -m bench.sim_calibration --fit
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from bench.sim_calibration_cases import CASES, Case, source_name
from obs.engines.sim.frontend import FrontEnd
from obs.engines.sim.hardware import CALIBRATION, Calibration, PerfModel, perf_model
from obs.engines.sim.scheduler import SchedulerConfig, SimRequest
from obs.sweep.virtual import VirtualLoop, VirtualReplica

LIMIT = 0.25  # the bar: each held-out point within 25% of the published figure
MEDIAN_LIMIT = 0.15  # and their median error at most 15%


def _perf(case: Case, cal: Calibration) -> PerfModel:
    return replace(perf_model(case.gpu, case.model, case.tp, case.weights), cal=cal)


def simulate(case: Case, cal: Calibration = CALIBRATION) -> dict[str, float]:
    """The simulator's figures for ``case`` (the metrics it publishes)."""
    loop = VirtualLoop()
    frontend = None if case.kind == "batch" else FrontEnd()
    replica = VirtualReplica(loop, _perf(case, cal), SchedulerConfig(), frontend=frontend)
    done: list[SimRequest] = []
    try:
        if case.kind == "closed":
            _closed(loop, replica, case, done)
        else:
            if case.kind == "batch":
                lengths = [(case.input_tokens, case.output_tokens)] * case.prompts
            else:
                lengths = list(zip(case.inputs, (max(1, o) for o in case.outputs), strict=True))
            reqs = [SimRequest(f"b{i}", p, o) for i, (p, o) in enumerate(lengths)]

            async def run() -> None:
                await asyncio.gather(*(replica.submit(r) for r in reqs))

            loop.run_until_complete(run())
            done = reqs
    finally:
        loop.close()
    return _figures(case, done)


def _closed(loop: VirtualLoop, replica: VirtualReplica, case: Case, done: list[SimRequest]) -> None:
    counter = itertools.count()
    rng = random.Random(f"calibration:{case.name}")
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


def _figures(case: Case, done: list[SimRequest]) -> dict[str, float]:
    span = max(r.finished_s or 0.0 for r in done) - min(r.arrival_s for r in done)
    ttft = [(r.first_token_s or 0.0) - r.arrival_s for r in done]
    if case.kind == "replay":  # benchmark_serving: a request with no output has TTFT 0
        ttft = [0.0 if o == 0 else t for t, o in zip(ttft, case.outputs, strict=True)]
    tpot = [
        ((r.finished_s or 0.0) - (r.first_token_s or 0.0)) / (r.output - 1)
        for r in done
        if r.output > 1
    ]
    out = {
        "output_tok_s": sum(r.output for r in done) / span,
        "ttft_ms": 1000 * statistics.mean(ttft),
        "tpot_ms": 1000 * statistics.mean(tpot) if tpot else math.nan,
        "latency_ms": 1000 * span,
    }
    out["decode_tok_s"] = 1000 / out["tpot_ms"]
    return out


def score(case: Case, cal: Calibration = CALIBRATION) -> list[dict[str, Any]]:
    """One entry per published figure of ``case``."""
    sim = simulate(case, cal)
    rows = []
    for metric, published in case.published.items():
        value = sim[metric]
        rows.append(
            {
                "point": f"{case.name}:{metric}",
                "held_out": case.held_out,
                "source": source_name(case.source),
                "url": case.source,
                "about": case.note,
                "gpu": case.gpu if case.tp == 1 else f"{case.tp}x {case.gpu}",
                "model": case.model + (" (FP8 weights)" if case.weights == "fp8" else ""),
                "tensor_parallel_size": case.tp,
                "workload": case.workload,
                "metric": metric,
                f"published_{metric}": published,
                f"sim_{metric}": round(value, 2),
                f"{metric}_ratio": round(value / published, 4),
                "error": round(abs(value / published - 1), 4),
                "derived": case.derived.get(metric),
            }
        )
    return rows


def table(cal: Calibration = CALIBRATION, cases: Sequence[Case] = CASES) -> list[dict[str, Any]]:
    return [row for case in cases for row in score(case, cal)]


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Fit and held-out errors, separately, and whether the held-out bars are met."""
    out: dict[str, Any] = {}
    for part, held in (("fit", False), ("held_out", True)):
        errors = [r["error"] for r in rows if r["held_out"] is held]
        out[part] = {
            "points": len(errors),
            "median_error": round(statistics.median(errors), 4),
            "max_error": round(max(errors), 4),
            "within_25pct": sum(e <= LIMIT for e in errors),
        }
    held_rows = [r for r in rows if r["held_out"]]
    out["held_out"]["sources"] = len({r["source"] for r in held_rows})
    out["held_out"]["h100_points"] = sum("H100" in r["gpu"] for r in held_rows)
    out["held_out"]["ttft_points"] = sum(r["metric"] == "ttft_ms" for r in held_rows)
    h = out["held_out"]
    out["bars_met"] = (
        h["points"] >= 8
        and h["sources"] >= 3
        and h["h100_points"] >= 2
        and h["ttft_points"] >= 1
        and h["median_error"] <= MEDIAN_LIMIT
        and h["max_error"] <= LIMIT
    )
    return out


# ---- the fit ----------------------------------------------------------------------------

GRID: dict[str, tuple[float, ...]] = {
    "mbu": (0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9),
    "mfu": (0.3, 0.4, 0.5, 0.6, 0.7),
    "step_s": (0.0, 0.0005, 0.001, 0.0015, 0.002, 0.0025, 0.003, 0.004),
    "seq_s": (0.0, 10e-6, 20e-6, 40e-6, 80e-6, 120e-6, 160e-6, 240e-6, 320e-6),
    "token_s": (0.0, 1e-6, 2e-6, 5e-6, 10e-6, 20e-6),
    "allreduce_s": (0.0, 5e-6, 10e-6, 15e-6, 20e-6, 30e-6, 40e-6, 50e-6, 60e-6, 80e-6),
}


def loss(cal: Calibration, cases: Sequence[Case]) -> float:
    """Mean absolute log error over the figures of ``cases``, each source weighing the
    same (one source's many points do not outvote another's few)."""
    by_source: dict[str, list[float]] = {}
    for c in cases:
        sim = simulate(c, cal)
        for m, v in c.published.items():
            by_source.setdefault(source_name(c.source), []).append(abs(math.log(sim[m] / v)))
    return statistics.mean(statistics.mean(errs) for errs in by_source.values())


def fit(
    cases: Sequence[Case] = CASES,
    start: Calibration = CALIBRATION,
    rounds: int = 3,
    progress: Callable[[str], None] = lambda _: None,
) -> tuple[Calibration, float]:
    """Coordinate descent over :data:`GRID` on the fit points only."""
    fit_cases = [c for c in cases if not c.held_out]
    best, best_loss = start, loss(start, fit_cases)
    names = {f.name for f in fields(Calibration)}
    for _ in range(rounds):
        improved = False
        for name, values in GRID.items():
            assert name in names
            for v in values:
                trial = replace(best, **{name: v})
                trial_loss = loss(trial, fit_cases)
                if trial_loss < best_loss - 1e-9:
                    best, best_loss, improved = trial, trial_loss, True
            progress(f"{name}={getattr(best, name)} loss={best_loss:.4f}")
        if not improved:
            break
    return best, best_loss


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, help="write every point and the summary here (JSON)")
    p.add_argument("--fit", action="store_true", help="fit the calibration on the fit points")
    p.add_argument(
        "--calibration",
        type=json.loads,
        default={},
        metavar="JSON",
        help="score these calibration values instead of the committed ones, "
        'e.g. \'{"mfu": 0.4, "seq_s": 0}\' (round 1 in docs/sim.md)',
    )
    p.add_argument(
        "--markdown",
        type=Path,
        metavar="ROUND1",
        help="print docs/sim.md's table (the committed figures beside ROUND1's)",
    )
    args = p.parse_args(argv)
    try:
        cal = replace(CALIBRATION, **args.calibration)
    except TypeError as e:
        p.error(f"--calibration: {e}")
    if args.fit:
        cal, value = fit(start=cal, progress=lambda m: print(m, file=sys.stderr, flush=True))
        print(json.dumps({"fit_loss": round(value, 4), "calibration": _cal(cal)}, indent=2))
        return 0
    rows = table(cal)
    if args.markdown is not None:
        round1 = json.loads(args.markdown.read_text(encoding="utf-8"))["points"]
        print("\n".join(markdown(rows, round1)))
        return 0
    for part, held in (("fit", False), ("held-out", True)):
        print(f"== {part} points ==")
        for r in (r for r in rows if r["held_out"] is held):
            m = r["metric"]
            print(
                f"{r['point']:<44} {r['gpu']:<10} published {r[f'published_{m}']:>9.2f}"
                f"  sim {r[f'sim_{m}']:>9.2f}  ratio {r[f'{m}_ratio']:.3f}"
            )
    s = summary(rows)
    print(json.dumps(s, indent=2))
    if args.out is not None:
        doc = {"calibration": _cal(cal), "summary": s, "points": rows}
        args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return 0


def markdown(rows: list[dict[str, Any]], round1: list[dict[str, Any]]) -> list[str]:
    """docs/sim.md's calibration table: each point, its committed and its round-1 figure."""
    first = {r["point"]: r for r in round1}
    out = [
        "| point | set | source | GPU | model | workload | metric | published | sim | ratio "
        "| round 1 sim | round 1 ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m, r1 = r["metric"], first[r["point"]]
        cells = [
            f"`{r['point']}`",
            "held out" if r["held_out"] else "fit",
            f"[{r['source']}]({r['url']})",
            r["gpu"],
            r["model"],
            r["workload"],
            m + (" (derived)" if r["derived"] else ""),
            f"{r[f'published_{m}']:g}",
            f"{r[f'sim_{m}']:g}",
            f"{r[f'{m}_ratio']:.2f}",
            f"{r1[f'sim_{m}']:g}",
            f"{r1[f'{m}_ratio']:.2f}",
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out


def _cal(cal: Calibration) -> dict[str, float]:
    return {f.name: getattr(cal, f.name) for f in fields(Calibration)}


if __name__ == "__main__":
    sys.exit(main())
