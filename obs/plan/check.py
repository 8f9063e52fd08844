"""The simulator against the operator's own ``vllm bench serve`` runs: replay, compare, fit.

Each run of a result file (obs.engines.sim.results) is replayed on a simulated replica in
virtual time (obs.sweep.virtual) with the API server in front (obs.engines.sim.frontend):
its requests with their lengths (per request with ``--save-detailed``, else the file's
means), sent as its client sent them -- at the recorded send times, or, without them, as
``vllm bench serve`` draws them (``request_rate``, gamma-distributed gaps of shape
``burstiness``, seeded), behind a semaphore of ``max_concurrency`` where the run had one.
The figures are computed as vLLM's benchmark computes them (``calculate_metrics``: TTFT
per request, TPOT ``(latency - ttft) / (output - 1)`` over requests of more than one
token, ITL every gap, E2EL the latency, percentiles by linear interpolation as
``np.percentile``; throughputs over the run's duration), and set beside the file's.

Runs given together are replayed in order on one replica (its prefix cache stays warm, as
on the server the benchmark ran against) unless ``fresh``. :func:`fit` searches this
host's corrections (a few :class:`~obs.engines.sim.hardware.Calibration` fields) that
minimise the mean absolute log error over the runs. Pure: no I/O.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from obs.engines.sim.frontend import FrontEnd, FrontEndCost
from obs.engines.sim.hardware import Calibration, PerfModel
from obs.engines.sim.results import LATENCIES, BenchRun
from obs.engines.sim.scheduler import SchedulerConfig, SimRequest
from obs.sweep.virtual import VirtualLoop, VirtualReplica

WITHIN = 0.25  # the summary's "within 25%"


@dataclass(frozen=True, slots=True)
class Setup:
    """The replica the runs were measured on, as ``engine sim`` flags give it."""

    perf: PerfModel
    scheduler: SchedulerConfig
    block_size: int = 16
    num_blocks: int | None = None
    prefix_caching: bool = True


def front_end(cal: Calibration) -> FrontEnd:
    """The API server's CPU under ``cal`` (its per-request cost and latency)."""
    return FrontEnd(FrontEndCost.split(cal.request_s, cal.first_token_s))


def replay(
    runs: Sequence[BenchRun], setup: Setup, *, fresh: bool = False, seed: int = 0
) -> list[dict[str, float]]:
    """The simulated figures of each run (the keys of ``results.METRICS``)."""
    out: list[dict[str, float]] = []
    loop = VirtualLoop()
    try:
        replica = None
        for i, run in enumerate(runs):
            if replica is None or fresh:
                replica = VirtualReplica(
                    loop,
                    setup.perf,
                    setup.scheduler,
                    setup.block_size,
                    setup.num_blocks,
                    front_end(setup.perf.cal),
                    setup.prefix_caching,
                )
            rng = random.Random(f"{seed}:{i}:{run.file}")
            reqs = loop.run_until_complete(_send(loop, replica, run, rng, i))
            out.append(figures(reqs))
    finally:
        loop.close()
    return out


async def _send(
    loop: asyncio.AbstractEventLoop,
    replica: VirtualReplica,
    run: BenchRun,
    rng: random.Random,
    k: int,
) -> list[SimRequest]:
    n = len(run.inputs)
    offsets = run.offsets or _arrivals(n, run.request_rate, run.burstiness, rng)
    gate = asyncio.Semaphore(run.max_concurrency) if run.max_concurrency else None
    start = loop.time()
    done: list[SimRequest] = []

    async def one(i: int) -> None:
        delay = start + offsets[i] - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        req = SimRequest(f"r{k}-{i}", run.inputs[i], max(1, run.outputs[i]))
        if gate is None:
            await replica.submit(req)
        else:
            async with gate:  # the client's wait for a slot is not the server's latency
                await replica.submit(req)
        done.append(req)

    await asyncio.gather(*(one(i) for i in range(n)))
    return done


def _arrivals(n: int, rate: float, burstiness: float, rng: random.Random) -> tuple[float, ...]:
    """Send times as ``vllm bench serve`` draws them (``get_request``): all at once at an
    infinite rate, else gaps from a gamma distribution of shape ``burstiness`` and mean
    ``1 / rate`` (burstiness 1: a Poisson process)."""
    if math.isinf(rate):
        return (0.0,) * n
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return tuple(out)


def figures(reqs: Sequence[SimRequest]) -> dict[str, float]:
    """vLLM's benchmark figures of the replayed requests (module docstring)."""
    ttft, tpot, e2el, itl = [], [], [], []
    for r in reqs:
        first, end = r.first_token_s or r.arrival_s, r.finished_s or r.arrival_s
        ttft.append(first - r.arrival_s)
        e2el.append(end - r.arrival_s)
        if r.output > 1:
            tpot.append((end - first) / (r.output - 1))
        for gap, count in r.gaps:
            itl.extend([gap] * count)
    start = min(r.arrival_s for r in reqs)
    duration = max(r.finished_s or 0.0 for r in reqs) - start
    out = {
        "request_throughput": len(reqs) / duration,
        "output_throughput": sum(r.output for r in reqs) / duration,
    }
    for name, values in zip(LATENCIES, (ttft, tpot, itl, e2el), strict=True):
        if values:
            out[f"mean_{name}_ms"] = 1000 * statistics.fmean(values)
            out[f"median_{name}_ms"] = 1000 * percentile(values, 50)
            out[f"p99_{name}_ms"] = 1000 * percentile(values, 99)
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """``np.percentile``'s default (linear interpolation between closest ranks)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def compare(
    runs: Sequence[BenchRun], simulated: Sequence[dict[str, float]]
) -> list[dict[str, Any]]:
    """One row per run and metric the file has: measured, simulated, their ratio."""
    rows = []
    for run, sim in zip(runs, simulated, strict=True):
        for metric, measured in run.measured.items():
            value = sim.get(metric)
            if value is None or value <= 0:
                continue
            rows.append(
                {
                    "file": run.file,
                    "metric": metric,
                    "measured": _digits(measured),
                    "simulated": _digits(value),
                    "ratio": _digits(value / measured),
                }
            )
    return rows


def _digits(x: float) -> float:
    return float(f"{x:.6g}")


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median |error|, the worst ratio (farthest from 1 either way), the share within 25%,
    and how many simulated latencies are too fast (or throughputs too high)."""
    if not rows:
        return {"points": 0, "median_abs_error": None, "worst_ratio": None, "within_25": None}
    errors = [abs(r["ratio"] - 1) for r in rows]
    worst = max(rows, key=lambda r: abs(math.log(r["ratio"])))
    optimistic = sum(
        (r["ratio"] > 1) if r["metric"].endswith("throughput") else (r["ratio"] < 1) for r in rows
    )
    return {
        "points": len(rows),
        "median_abs_error": round(statistics.median(errors), 4),
        "max_abs_error": round(max(errors), 4),
        "worst_ratio": worst["ratio"],
        "worst": f"{worst['file']}: {worst['metric']}",
        "within_25": round(sum(e <= WITHIN for e in errors) / len(errors), 4),
        "optimistic": round(optimistic / len(rows), 4),
    }


# ---- the host's corrections ------------------------------------------------------------

# What differs from host to host: the GPU's reached bandwidth and FLOP/s, the CPU's cost
# per step and per sequence, and the API server's per request (docs/sim.md, "Your own
# benchmarks"). Each is searched by factors of the value it has, from a floor where the
# built-in value is 0, so a host far from the built-in numbers (a CPU, a throttled card) is
# reached in a few passes.
FIT_FIELDS: dict[str, tuple[float, float]] = {  # field: (floor, cap)
    "mbu": (0.05, 0.98),
    "mfu": (0.05, 0.9),
    "step_s": (100e-6, 1.0),
    "seq_s": (5e-6, 0.1),
    "request_s": (100e-6, 1.0),
    "first_token_s": (1e-3, 1.0),
}
FACTORS = (0.0, 0.25, 0.5, 0.7, 1.4, 2.0, 4.0)


def candidates(name: str, value: float) -> list[float]:
    """The values :func:`fit` tries for ``name`` from ``value`` (within its bounds)."""
    floor, cap = FIT_FIELDS[name]
    base = max(value, floor)
    out = {min(cap, base * f) for f in FACTORS if f} | {value}
    if name not in ("mbu", "mfu"):
        out.add(0.0)
    return sorted(out)


# The figures a fit weighs: means and medians, not the p99s (a host's jitter and the first
# request's warm-up set them) nor the median ITL (how a starved client's reads group the
# streamed frames: 0 when two frames arrive in one read).
FIT_METRICS = frozenset(
    {f"{s}_{m}_ms" for m in ("ttft", "tpot", "e2el") for s in ("mean", "median")}
    | {"mean_itl_ms", "request_throughput", "output_throughput"}
)


def loss(runs: Sequence[BenchRun], setup: Setup, fresh: bool = False) -> float:
    """Mean absolute log error of the simulated figures over the runs' :data:`FIT_METRICS`."""
    rows = compare(runs, replay(runs, setup, fresh=fresh))
    errors = [abs(math.log(r["ratio"])) for r in rows if r["metric"] in FIT_METRICS]
    return statistics.fmean(errors) if errors else math.inf


def fit(
    runs: Sequence[BenchRun],
    setup: Setup,
    *,
    fresh: bool = False,
    passes: int = 4,
    progress: Callable[[str], None] = lambda _: None,
) -> tuple[Calibration, float]:
    """Coordinate descent over :data:`FIT_FIELDS` from the setup's calibration, each pass
    trying every field's :func:`candidates` around its current value."""
    names = {f.name for f in fields(Calibration)}
    best = setup.perf.cal
    best_loss = loss(runs, setup, fresh)
    for _ in range(passes):
        improved = False
        for name in FIT_FIELDS:
            assert name in names
            for value in candidates(name, getattr(best, name)):
                trial = replace(best, **{name: value})
                trial_loss = loss(runs, replace(setup, perf=replace(setup.perf, cal=trial)), fresh)
                if trial_loss < best_loss - 1e-9:
                    best, best_loss, improved = trial, trial_loss, True
            progress(f"{name} = {getattr(best, name):g}: loss {best_loss:.4f}")
        if not improved:
            break
    return best, best_loss


def held_out_rows(
    runs: Sequence[BenchRun], setup: Setup, *, fresh: bool = False
) -> list[dict[str, Any]]:
    """Each run compared under corrections fitted on the other runs only (leave one out):
    the fitted simulator's error on figures it was not fitted to. Empty for one run."""
    if len(runs) < 2:
        return []
    rows: list[dict[str, Any]] = []
    for i, run in enumerate(runs):
        others = [r for k, r in enumerate(runs) if k != i]
        cal, _ = fit(others, setup, fresh=fresh)
        corrected = replace(setup, perf=replace(setup.perf, cal=cal))
        rows += compare([run], replay([run], corrected))
    return rows
