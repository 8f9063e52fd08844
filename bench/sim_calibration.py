"""The simulator against published measurements of real vLLM, fitted on some and scored on others.

Every point is one published figure of one benchmark run (docs/sim.md, "Calibration",
cites each). Which points are **fit** points and which are **held out** is fixed in
the cases' modules: the first sources (bench/sim_calibration_cases.py) and the later ones
(bench/sim_calibration_points.py: ``LATER``) are fit points; the held-out points
(``HELD_OUT`` there) were registered before the model was run on any of them and are
never fitted. A figure a case names in ``unfit`` (its
published value needs more than the GPU's peak) is scored and shown but not fitted.

Each run is replayed with the scheduler limits its vLLM chose (obs.engines.sim.scheduler's
``vllm_defaults``: by GPU, engine V0/V1 and entry point) and with its engine's CPU costs
(``Calibration.engine``).

``--fit`` searches the calibration (hardware.Calibration: mfu, mbu, the CPU's costs per
step, sequence and token for V1 and for V0, the all-reduce latency; since round 4 also the
FP8 weight bandwidth share, a per-layer step floor, and the API server's cost and latency
per request) that minimises the
mean absolute log error over the fit points only (each source weighing the same), and
prints it; the committed values in
obs/engines/sim/hardware.py are its result. Without ``--fit`` the committed calibration
is scored: fit and held-out errors are printed separately, and ``--out`` writes one
entry per point (source, GPU, model, workload, published and simulated value, their
ratio, ``held_out``).

Workloads, replayed on one simulated replica in virtual time:

- ``closed``: ``vllm bench serve --max-concurrency C --request-rate inf``, fixed input,
  output ``output_tokens`` (``--ignore-eos``) or, without it, ended with a fixed chance per
  token capped at ``max_tokens`` at the run's published mean
  (bench/sim_calibration_replay.py: ``output_lengths``),
  random prompts (no prefix-cache hits) unless the case gives the source's own prompt
  list and warm-up (since round 6: ``Case.prompt_set``, ``warmup_rounds``), the API
  server's CPU in front
  (obs.engines.sim.frontend);
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
import json
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from bench.sim_calibration_cases import Case, source_name
from bench.sim_calibration_points import CASES
from bench.sim_calibration_replay import closed
from obs.engines.sim.frontend import FrontEnd, FrontEndCost
from obs.engines.sim.hardware import CALIBRATION, GPUS, Calibration, PerfModel, perf_model
from obs.engines.sim.scheduler import SchedulerConfig, SimRequest, vllm_defaults
from obs.sweep.virtual import VirtualLoop, VirtualReplica, gap_percentile

LIMIT = 0.25  # the bar: each held-out point within 25% of the published figure
MEDIAN_LIMIT = 0.15  # and their median error at most 15%


def _perf(case: Case, cal: Calibration) -> PerfModel:
    perf = perf_model(case.gpu, case.model, case.tp, case.weights)
    return replace(perf, cal=cal.engine(case.engine))


def front_end_cost(cal: Calibration, floor_s: float | None = None) -> FrontEndCost:
    """The API server's costs under ``cal`` (round 4: a per-request cost and latency; round
    5: ``floor_s``, a host's declared per-request latency, in place of the fitted one)."""
    if not cal.request_s and not cal.first_token_s and floor_s is None:
        return FrontEndCost()  # rounds 1-3
    return FrontEndCost.split(cal.request_s, cal.first_token_s if floor_s is None else floor_s)


def scheduler_config(case: Case) -> SchedulerConfig:
    """The limits the run's vLLM chose: its defaults for that GPU, engine and entry point,
    and its own ``--max-num-seqs`` where it set one."""
    config = vllm_defaults(
        case.gpu,
        GPUS[case.gpu].memory_bytes,
        v1=case.engine == "v1",
        server=case.kind != "batch",
        max_model_len=case.max_model_len,
        scheduler_steps=case.scheduler_steps,
    )
    return replace(config, max_num_seqs=case.max_num_seqs) if case.max_num_seqs else config


def host_floor(case: Case, cal: Calibration = CALIBRATION) -> float | None:
    """The per-request latency of the case's host (seconds), declared by rule from the same
    host's published TTFT at concurrency 1 (``case.host_c1_ttft_ms``): that TTFT less the
    one the model gives at concurrency 1 with no such latency, at least 0. None (the fitted
    ``first_token_s``) when the source publishes no such row."""
    if not case.host_c1_ttft_ms:
        return None
    metric = "ttft_p50_ms" if "ttft_p50_ms" in case.published else "ttft_ms"
    c1 = replace(case, concurrency=1, prompts=min(case.prompts, 20), host_c1_ttft_ms=0.0)
    bare = simulate(c1, cal, floor_s=0.0)[metric]
    return max(0.0, case.host_c1_ttft_ms - bare) / 1000


def simulate(
    case: Case, cal: Calibration = CALIBRATION, floor_s: float | None = None
) -> dict[str, float]:
    """The simulator's figures for ``case`` (the metrics it publishes)."""
    if floor_s is None:
        floor_s = host_floor(case, cal)
    loop = VirtualLoop()
    frontend = None if case.kind == "batch" else FrontEnd(front_end_cost(cal, floor_s))
    replica = VirtualReplica(loop, _perf(case, cal), scheduler_config(case), frontend=frontend)
    done: list[SimRequest] = []
    try:
        if case.kind == "closed":
            closed(loop, replica, case, done)
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
    gaps = [g for r in done for g in r.gaps]
    out = {
        "output_tok_s": sum(r.output for r in done) / span,
        "ttft_ms": 1000 * statistics.mean(ttft),
        "ttft_p50_ms": 1000 * statistics.median(ttft),
        "itl_p50_ms": 1000 * gap_percentile(gaps, 0.5),
        "tpot_ms": 1000 * statistics.mean(tpot) if tpot else math.nan,
        "tpot_p50_ms": 1000 * statistics.median(tpot) if tpot else math.nan,
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
                "not_fitted": case.unfit.get(metric),
                "outside_domain": case.outside_domain or None,
            }
        )
    return rows


def table(cal: Calibration = CALIBRATION, cases: Sequence[Case] = CASES) -> list[dict[str, Any]]:
    return [row for case in cases for row in score(case, cal)]


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Fit and held-out errors, separately, and whether the held-out bars are met (on every
    held-out point); ``held_out_in_domain`` leaves out those outside the model's domain."""
    out: dict[str, Any] = {}
    parts = (
        ("fit", lambda r: not r["held_out"]),
        ("held_out", lambda r: r["held_out"]),
        ("held_out_in_domain", lambda r: r["held_out"] and not r.get("outside_domain")),
    )
    for part, keep in parts:
        errors = [r["error"] for r in rows if keep(r)]
        out[part] = {
            "points": len(errors),
            "median_error": round(statistics.median(errors), 4) if errors else None,
            "max_error": round(max(errors), 4) if errors else None,
            "within_25pct": sum(e <= LIMIT for e in errors),
        }
    held_rows = [r for r in rows if r["held_out"]]
    out["held_out"]["sources"] = len({r["source"] for r in held_rows})
    out["held_out"]["h100_points"] = sum("H100" in r["gpu"] for r in held_rows)
    out["held_out"]["ttft_points"] = sum(r["metric"].startswith("ttft") for r in held_rows)
    h = out["held_out"]
    out["bars_met"] = (
        h["points"] >= 8
        and h["sources"] >= 3
        and h["h100_points"] >= 2
        and h["ttft_points"] >= 1
        and (h["median_error"] or 0.0) <= MEDIAN_LIMIT
        and (h["max_error"] or 0.0) <= LIMIT
    )
    return out


# ---- the fit ----------------------------------------------------------------------------

GRID: dict[str, tuple[float, ...]] = {
    "mbu": (0.6, 0.65, 0.7, 0.75, 0.8, 0.825, 0.85, 0.875, 0.9, 0.95),
    "mfu": (0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8),
    "step_s": (0.0, 0.00025, 0.0005, 0.00075, 0.001, 0.00125, 0.0015, 0.002, 0.003, 0.004),
    "seq_s": (0.0, 5e-6, 10e-6, 20e-6, 40e-6, 80e-6, 120e-6, 160e-6, 240e-6, 320e-6),
    "token_s": (0.0, 1e-6, 2e-6, 5e-6, 10e-6, 20e-6),
    "allreduce_s": (0.0, 5e-6, 10e-6, 15e-6, 20e-6, 30e-6, 40e-6, 50e-6, 60e-6, 80e-6),
    "v0_step_s": (0.0, 0.0005, 0.001, 0.00125, 0.0015, 0.00175, 0.002, 0.0025, 0.003, 0.004),
    "v0_seq_s": (0.0, 10e-6, 20e-6, 40e-6, 80e-6, 100e-6, 120e-6, 140e-6, 160e-6, 240e-6, 320e-6),
    "v0_token_s": (0.0, 1e-6, 2e-6, 5e-6, 10e-6, 15e-6, 20e-6, 30e-6, 40e-6),
    "layer_s": (0.0, 5e-6, 10e-6, 15e-6, 20e-6, 30e-6, 40e-6, 50e-6, 60e-6, 80e-6),
    "fp8_mbu": (0.4, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9),
    # request_s is set from vLLM's source, not fitted (docs/sim.md, "Current result")
    "first_token_s": (0.0, 2e-3, 5e-3, 8e-3, 10e-3, 12e-3, 15e-3, 18e-3, 20e-3, 25e-3),
    "roofline_p": (0.0, 1.0, 2.0, 4.0),
    "multistep_s": (0.0, 0.25e-3, 0.5e-3, 1e-3, 1.5e-3, 2e-3, 3e-3),
    "tp_step_s": (0.0, 0.25e-3, 0.5e-3, 1e-3, 1.5e-3, 2e-3, 3e-3),
    "attn_mbu": (0.0, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8),
}


def loss(cal: Calibration, cases: Sequence[Case]) -> float:
    """Mean absolute log error over the figures of ``cases``, each source weighing the
    same (one source's many points do not outvote another's few)."""
    by_source: dict[str, list[float]] = {}
    for c in cases:
        sim = simulate(c, cal)
        for m, v in c.published.items():
            if m in c.unfit:
                continue
            by_source.setdefault(source_name(c.source), []).append(abs(math.log(sim[m] / v)))
    return statistics.mean(statistics.mean(errs) for errs in by_source.values())


def fit(
    cases: Sequence[Case] = CASES,
    start: Calibration = CALIBRATION,
    rounds: int = 2,
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
    p.add_argument("--markdown", action="store_true", help="print docs/sim.md's table")
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
    if args.markdown:
        print("\n".join(markdown(rows)))
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


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    """docs/sim.md's calibration table: each point, its set, published and simulated figure."""
    out = [
        "| point | set | source | GPU | model | workload | metric | published | sim | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m = r["metric"]
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
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out


def _cal(cal: Calibration) -> dict[str, float]:
    return {f.name: getattr(cal, f.name) for f in fields(Calibration)}


if __name__ == "__main__":
    sys.exit(main())
