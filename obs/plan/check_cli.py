"""The handler of ``vllm-obs engine sim check`` (its parser: obs.engines.sim.check_command)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from obs.engines.sim.calibration import calibration_doc
from obs.engines.sim.check_command import UNMODELLED
from obs.errors import ConfigError, InputError
from obs.plan import check


def refuse_unmodelled(args: argparse.Namespace) -> None:
    """A clear error for a vLLM flag the simulator does not model."""
    for flag in UNMODELLED:
        if getattr(args, flag[2:].replace("-", "_")) is not None:
            raise ConfigError(
                f"{flag}: the simulator does not model {UNMODELLED[flag]}; check a run made "
                "without it"
            )


def setup(args: argparse.Namespace) -> check.Setup:
    """The simulated replica the flags describe."""
    from obs.engines.sim.cli import hardware
    from obs.engines.sim.hardware import perf_model
    from obs.engines.sim.scheduler import vllm_defaults

    for flag in ("max_num_batched_tokens", "max_num_seqs", "block_size", "num_scheduler_steps"):
        value = getattr(args, flag)
        if value is not None and value <= 0:
            raise ConfigError(f"--{flag.replace('_', '-')} must be positive, got {value}")
    if not 0 < args.gpu_memory_utilization <= 1:
        raise ConfigError("--gpu-memory-utilization must be in (0, 1]")
    gpu, model, cal = hardware(args)
    weights = "fp8" if args.quantization == "fp8" else "bf16"
    perf = perf_model(gpu, model, args.tensor_parallel_size, weights, args.kv_cache_dtype)
    perf = replace(perf, cal=replace(cal, memory_utilization=args.gpu_memory_utilization))
    sched = vllm_defaults(perf.gpu.name, perf.gpu.memory_bytes, v1=args.num_scheduler_steps == 1)
    sched = replace(
        sched,
        max_num_batched_tokens=args.max_num_batched_tokens or sched.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs or sched.max_num_seqs,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        chunked_prefill=args.enable_chunked_prefill and sched.chunked_prefill,
        num_scheduler_steps=args.num_scheduler_steps,
    )
    if args.num_gpu_blocks_override is None:
        perf.kv_blocks(args.block_size)  # fits, or says why
    return check.Setup(
        perf, sched, args.block_size, args.num_gpu_blocks_override, args.enable_prefix_caching
    )


def run(args: argparse.Namespace) -> int:
    from obs.engines.sim.results import read_runs

    refuse_unmodelled(args)
    where = setup(args)
    runs = [r for path in args.results for r in read_runs(Path(path))]
    for r in runs:
        if not r.detailed:
            print(
                f"warning: {r.file} has no per-request lengths (run with --save-detailed); "
                "replayed with its mean input and output lengths",
                file=sys.stderr,
            )
    if args.fit is not None:
        cal, _value = check.fit(
            runs,
            where,
            fresh=args.fresh,
            progress=lambda m: print(f"fit: {m}", file=sys.stderr, flush=True),
        )
        where = replace(where, perf=replace(where.perf, cal=cal))
    rows = check.compare(runs, check.replay(runs, where, fresh=args.fresh, seed=args.seed))
    if not rows:
        raise InputError(
            "the files have no figure the simulator gives (TTFT, TPOT, ITL, E2EL, throughput)"
        )
    summary = check.summary(rows)
    print(table(rows, summary))
    doc = {"rows": rows, "summary": summary, "setup": describe(where)}
    if args.json is not None:
        _write(args.json, doc)
    if args.fit is not None:
        checked: dict[str, Any] = {"files": [str(p) for p in args.results], **summary}
        held = check.held_out_rows(runs, setup(args), fresh=args.fresh)
        if held:
            checked["held_out"] = check.summary(held)
            print(
                f"held out (each run under corrections fitted on the others): "
                f"median |error| {checked['held_out']['median_abs_error']:.1%}, worst ratio "
                f"{checked['held_out']['worst_ratio']:.2f}"
            )
        _write(args.fit, calibration_doc(where.perf.cal, describe(where), checked))
        print(f"wrote the fitted calibration to {args.fit} (use it with --calibration)")
    return 0


def describe(where: check.Setup) -> dict[str, Any]:
    perf = where.perf
    return {
        "gpu": perf.gpu.name,
        "model": perf.model.name,
        "tensor_parallel_size": perf.tp,
        "max_num_batched_tokens": where.scheduler.max_num_batched_tokens,
        "max_num_seqs": where.scheduler.max_num_seqs,
    }


def _write(path: Path, doc: dict[str, Any]) -> None:
    try:
        path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    except OSError as e:
        raise InputError(f"{path}: cannot write it ({e.strerror or e})") from e


def table(rows: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    """The rows as aligned text, one block per file, and the summary line."""
    lines = [f"{'metric':<26} {'measured':>12} {'simulated':>12} {'ratio':>7}"]
    current = None
    for r in rows:
        if r["file"] != current:
            current = r["file"]
            lines.append(f"== {current}")
        lines.append(
            f"{r['metric']:<26} {r['measured']:>12.2f} {r['simulated']:>12.2f} {r['ratio']:>7.2f}"
        )
    lines.append(
        f"summary: {summary['points']} figures, median |error| "
        f"{summary['median_abs_error']:.1%}, worst ratio {summary['worst_ratio']:.2f} "
        f"({summary['worst']}), {summary['within_25']:.0%} within 25%, "
        f"{summary['optimistic']:.0%} optimistic (latency too low or throughput too high)"
    )
    return "\n".join(lines)
