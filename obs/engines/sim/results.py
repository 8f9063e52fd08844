"""A ``vllm bench serve --save-result`` file: the workload it ran and the figures it measured.

The format is vLLM's own (``vllm/benchmarks/serve.py``, 0.32: ``main`` builds
``result_json``): the run's setup (``backend``, ``model_id``, ``num_prompts``,
``request_rate`` -- a number or ``"inf"`` --, ``burstiness``, ``max_concurrency``), its
totals (``duration`` in seconds, ``completed``, ``failed``, ``total_input_tokens``,
``total_output_tokens``, ``request_throughput``, ``output_throughput``,
``total_token_throughput``) and, per metric of ``--percentile-metrics`` (default ``ttft,
tpot, itl``; ``e2el`` when asked), ``mean_X_ms``, ``median_X_ms``, ``std_X_ms`` and
``pNN_X_ms``. With ``--save-detailed`` it keeps the per-request lists ``input_lens``,
``output_lens``, ``ttfts``, ``itls``, ``start_times`` and ``errors`` (without it vLLM
deletes them). ``--append-result`` appends one JSON object per line to the same file:
each is a run of its own.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from obs.errors import InputError

LATENCIES = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "median", "p99")
THROUGHPUTS = ("request_throughput", "output_throughput")
METRICS = tuple(f"{s}_{m}_ms" for m in LATENCIES for s in STATS) + THROUGHPUTS
# What the simulator does not model: a run that used it is refused, not replayed wrong.
NOT_MODELLED = {
    "spec_decode_acceptance_rate": "speculative decoding",
    "ramp_up_strategy": "a ramped request rate (--ramp-up-strategy)",
    "diffusion_committed_throughput": "diffusion decoding",
}
REQUIRED = ("duration", "completed", "total_input_tokens", "request_rate")


@dataclass(frozen=True, slots=True)
class BenchRun:
    """One run of a result file: what to replay and what it measured."""

    file: str
    inputs: tuple[int, ...]  # each replayed request's prompt tokens
    outputs: tuple[int, ...]  # and output tokens
    offsets: tuple[float, ...] | None  # its send time from the first's (detailed, open loop)
    request_rate: float  # requests/s (math.inf: all at once)
    burstiness: float
    max_concurrency: int | None
    measured: dict[str, float]  # the METRICS the file has
    detailed: bool  # per-request lengths known (--save-detailed)


def read_runs(path: Path) -> list[BenchRun]:
    """Every run of the file; :class:`InputError` naming the file when it is not one."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"{path}: cannot read it ({e.strerror or e})") from e
    try:
        docs = [json.loads(text)]
    except ValueError:
        try:  # --append-result: one object per line
            docs = [json.loads(line) for line in text.splitlines() if line.strip()]
        except ValueError as e:
            raise InputError(f"{path}: not JSON, so not a `vllm bench serve` result ({e})") from e
    runs = [_run(path, doc, i, len(docs)) for i, doc in enumerate(docs)]
    if not runs:
        raise InputError(f"{path}: empty, not a `vllm bench serve --save-result` file")
    return runs


def _run(path: Path, doc: Any, i: int, n: int) -> BenchRun:
    name = str(path) if n == 1 else f"{path}#{i + 1}"
    if not isinstance(doc, dict) or any(k not in doc for k in REQUIRED):
        raise InputError(
            f"{name}: not a `vllm bench serve --save-result` file (it needs {', '.join(REQUIRED)})"
        )
    for key, what in NOT_MODELLED.items():
        if doc.get(key) is not None:
            raise InputError(f"{name}: the run used {what}, which the simulator does not model")
    if "total_output_tokens" not in doc:
        raise InputError(
            f"{name}: a pooling run (no output tokens); the simulator serves generation"
        )
    completed = _count(doc, "completed", name)
    if completed == 0:
        raise InputError(f"{name}: no request completed; nothing to compare")
    rate = _rate(doc.get("request_rate"), name)
    burst = doc.get("burstiness")
    burstiness = float(burst) if isinstance(burst, int | float) and burst > 0 else 1.0
    conc = doc.get("max_concurrency")
    concurrency = int(conc) if isinstance(conc, int) and conc > 0 else None
    measured = {
        k: float(doc[k])
        for k in METRICS
        if isinstance(doc.get(k), int | float) and math.isfinite(doc[k]) and doc[k] > 0
    }
    lens = _detailed(doc, name)
    if lens is not None:
        inputs, outputs, offsets = lens
        detailed = True
    else:
        total_in = _count(doc, "total_input_tokens", name)
        total_out = _count(doc, "total_output_tokens", name)
        inputs, outputs = _spread(total_in, completed), _spread(total_out, completed)
        offsets, detailed = None, False
    if concurrency is not None:
        offsets = None  # a client semaphore: the sends follow the server, replayed as such
    return BenchRun(
        name, inputs, outputs, offsets, rate, burstiness, concurrency, measured, detailed
    )


def _detailed(
    doc: dict[str, Any], name: str
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[float, ...] | None] | None:
    """The successful requests' lengths and send times (``--save-detailed``), else None."""
    ins, outs = doc.get("input_lens"), doc.get("output_lens")
    if not isinstance(ins, list) or not isinstance(outs, list):
        return None
    if len(ins) != len(outs) or not all(isinstance(x, int) for x in (*ins, *outs)):
        raise InputError(f"{name}: input_lens and output_lens must be lists of integers, alike")
    errors = doc.get("errors")
    failed = [bool(e) for e in errors] if isinstance(errors, list) else [False] * len(ins)
    starts = doc.get("start_times")
    keep = [i for i in range(len(ins)) if not failed[i] and outs[i] > 0]
    if not keep:
        raise InputError(f"{name}: no request succeeded; nothing to compare")
    offsets = None
    if isinstance(starts, list) and len(starts) == len(ins):
        t0 = min(starts[i] for i in keep)
        offsets = tuple(float(starts[i]) - t0 for i in keep)
    return tuple(ins[i] for i in keep), tuple(outs[i] for i in keep), offsets


def _spread(total: int, n: int) -> tuple[int, ...]:
    """``n`` lengths of at least 1 summing to ``total`` (where it allows), as even as can be."""
    q, r = divmod(total, n)
    return tuple(max(1, q + (i < r)) for i in range(n))


def _count(doc: dict[str, Any], key: str, name: str) -> int:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"{name}: {key} must be a count, got {value!r}")
    return value


def _rate(value: Any, name: str) -> float:
    if value == "inf" or value is None:
        return math.inf
    if isinstance(value, int | float) and value > 0:
        return float(value)
    raise InputError(f'{name}: request_rate must be a positive number or "inf", got {value!r}')
