"""``vllm-obs plan``'s handler: config and pools in, traffic read, each pool planned, written.

The typed request (:class:`PlanRequest`) is built once from the command line; errors in it
name the option. Progress goes to stderr, the tables to stdout.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from obs.config import Config, load_config, read_yaml
from obs.engines.sim.calibration import HostCalibration, load_calibration
from obs.engines.sim.hardware import Calibration, perf_model, with_calibration
from obs.engines.sim.scheduler import SchedulerConfig
from obs.errors import ConfigError, InputError
from obs.plan import report
from obs.plan.judge import calibration_margin
from obs.plan.planner import PoolPlan, PoolPlanner
from obs.plan.replay import PoolModel
from obs.plan.source import read_traffic, window_seconds
from obs.plan.traffic import Traffic
from obs.progress import ProgressLine

CALIBRATION = Path(__file__).resolve().parents[2] / "bench" / "results" / "sim_calibration.json"
DEFAULT_GPU = "H100"
DEFAULT_MODEL = "llama-3.1-8b"


@dataclass(frozen=True, slots=True)
class PlanRequest:
    events: list[str]
    config: Path
    growth: float = 1.0
    gpu: list[str] | None = None
    model: list[str] | None = None
    window: str | None = None
    out: Path = Path("plan")
    seed: int = 0
    max_requests: int = 200_000
    margin: float | None = None
    progress: bool | None = None
    calibration: Path | None = None  # a host calibration (engine sim check --fit)
    k8s: Path | None = None  # the kustomize package: write its autoscalers' bounds


def per_pool(values: list[str], pools: list[str], option: str) -> tuple[str | None, dict[str, str]]:
    """``--gpu H100 --gpu bulk=A100-80GB`` -> (``H100``, ``{"bulk": "A100-80GB"}``)."""
    default, by_pool = None, {}
    for v in values:
        pool, sep, name = v.partition("=")
        if not sep:
            default = v
        elif pool not in pools:
            raise ConfigError(f"{option} {v!r}: no pool {pool!r} (pools: {', '.join(pools)})")
        else:
            by_pool[pool] = name
    return default, by_pool


def load(path: Path) -> tuple[Config, dict[str, Any], dict[str, Any]]:
    """The config, its YAML data as the lanes.yaml to write, and each pool's ``gpu:`` block
    when ``path`` is a sweep profile (empty for a lanes config)."""
    data = read_yaml(path)
    from obs.sweep.profile import is_profile, parse_profile

    if is_profile(data):
        profile = parse_profile(data, str(path))
        replicas = {p.name: list(p.replicas) for p in profile.config.pools}
        return profile.config, profile.lanes_config(replicas), dict(profile.gpu_pools())
    config = load_config(path)
    assert isinstance(data, dict)
    return config, data, {}


def pool_models(
    config: Config,
    gpus: dict[str, Any],
    gpu: list[str],
    model: list[str],
    cal: Calibration | None = None,
) -> dict[str, PoolModel]:
    """Each pool's simulated replica: --gpu/--model, else the profile's gpu: block, else
    H100 and llama-3.1-8b; scheduler flags from the profile or the pool's engine block."""
    names = [p.name for p in config.pools]
    gpu_all, gpu_by = per_pool(gpu, names, "--gpu")
    model_all, model_by = per_pool(model, names, "--model")
    out = {}
    for pool in config.pools:
        flags = gpus.get(pool.name)
        g = gpu_by.get(pool.name) or gpu_all or (flags.gpu if flags else DEFAULT_GPU)
        m = model_by.get(pool.name) or model_all or (flags.model if flags else DEFAULT_MODEL)
        declared = pool.declared.values() if pool.declared is not None else {}

        def flag(name: str, default: int, flags: Any = flags, declared: Any = declared) -> int:
            value = getattr(flags, name, None) if flags is not None else None
            return int(value or declared.get(name) or default)

        sched = SchedulerConfig(
            max_num_batched_tokens=flag("max_num_batched_tokens", 8192),
            max_num_seqs=flag("max_num_seqs", 256),
            long_prefill_token_threshold=flag("long_prefill_token_threshold", 0),
        )
        kv = getattr(flags, "kv_blocks", None) if flags is not None else None
        perf = perf_model(g, m)
        perf = perf if cal is None else with_calibration(perf, cal)
        out[pool.name] = PoolModel(pool.name, g, m, perf, sched, kv)
    return out


def host_margin(host: HostCalibration) -> tuple[float, str]:
    """The margin a host calibration gives: the corrected simulator's largest error on this
    host's benchmark figures it was not fitted to (each run under corrections fitted on the
    others), or, from one run, on the figures it was fitted on; their median beside it."""
    how = "held-out (each run under a fit on the others)" if host.held_out else "fitted"
    return host.max_abs_error, (
        f"largest {how} error of the host calibration {host.path} on {host.points} figures "
        f"of this host's own benchmarks (checked), median {host.median_abs_error:.1%}"
    )


class _Progress:
    """One progress line per replay on stderr."""

    def __init__(self, stream: TextIO, enabled: bool | None) -> None:
        tty = stream.isatty()
        on = tty if enabled is None else enabled
        self.line = ProgressLine(
            stream,
            in_place=tty and on,
            interval_s=0.2,
            every_s=10.0 if on or enabled is None else None,
        )
        self.started = time.monotonic()

    def __call__(self, label: str) -> Any:
        def update(done: int, total: int) -> None:
            final = done >= total
            self.line.draw(f"[plan] replaying {label}: {done}/{total} requests", final=final)

        return update if self.line.enabled else None


def autoscaler_bounds(
    package: Path, recorded: list[PoolPlan], grown: list[PoolPlan], say: Any
) -> Path:
    """``package/autoscaling/bounds.yaml``: each pool planned at both loads, recorded to grown."""
    from obs.kube.autoscale import write_bounds

    bounds = {}
    for low, high in zip(recorded, grown, strict=True):
        if low.replicas is None or high.replicas is None:
            say(f"[plan] pool {low.pool.name}: no size met every SLO; its bounds are not written")
            continue
        bounds[low.pool.name] = (low.replicas, high.replicas)
    return write_bounds(package, bounds, "vllm-obs plan")


def _plan_pools(
    req: PlanRequest,
    config: Config,
    models: dict[str, PoolModel],
    traffic: Traffic,
    growth: float,
    margin: float,
    say: Callable[[str], None],
    progress: _Progress,
    tell_partial: bool = True,
) -> list[PoolPlan]:
    """Each pool's plan at ``growth``, saying (``tell_partial``) which pools were replayed in
    part (``--max-requests``)."""
    plans = []
    for name, model in models.items():
        planner = PoolPlanner(
            config,
            model,
            traffic,
            growth,
            margin,
            seed=req.seed,
            max_requests=req.max_requests,
            say=say,
            progress=progress,
        )
        if tell_partial and planner.plan.replayed_s < traffic.span_s:
            say(
                f"[plan] pool {name}: replaying the busiest {planner.plan.replayed_s:g} s of "
                f"the {traffic.span_s:g} s window ({planner.plan.requests} requests, "
                f"--max-requests {req.max_requests})"
            )
        plans.append(planner.run())
    return plans


def plan(req: PlanRequest, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr

    def say(msg: str) -> None:
        print(msg, file=stderr, flush=True)

    if req.growth <= 0:
        raise InputError(f"--growth {req.growth:g}: must be positive")
    if req.max_requests < 1:
        raise InputError(f"--max-requests {req.max_requests}: must be at least 1")
    if req.margin is not None and not 0 <= req.margin < 10:
        raise InputError(f"--margin {req.margin:g}: give a fraction, e.g. 0.25")
    config, data, gpus = load(req.config)
    for lane in config.lanes:
        if lane.split or lane.fallback:
            raise ConfigError(
                f"{req.config}: lane {lane.name!r} has a traffic split or fallback pool, which "
                "the plan's replay does not replay (yet)"
            )
    host = load_calibration(req.calibration) if req.calibration is not None else None
    models = pool_models(
        config, gpus, req.gpu or [], req.model or [], host.cal if host is not None else None
    )
    if req.margin is not None:
        margin, margin_source = req.margin, "--margin"
    elif host is not None:
        margin, margin_source = host_margin(host)
    else:
        margin, margin_source = calibration_margin(CALIBRATION)
    window_s = window_seconds(req.window)
    t0 = time.monotonic()
    traffic = read_traffic(req.events, config, window_s, progress=req.progress)
    offered = sum(lt.offered for lt in traffic.lanes.values())
    say(
        f"[plan] read {traffic.events} events in {time.monotonic() - t0:.1f} s: {offered} "
        f"offered to the config's lanes over {traffic.span_s:g} s"
        + (" (request shapes sampled per lane)" if traffic.sampled else "")
    )
    for note in traffic.notes:
        say(f"[plan] warning: {note}")
    if not offered:
        raise InputError("no event of the events belongs to a lane of --config: nothing to plan")
    progress = _Progress(stderr, req.progress)
    plans = _plan_pools(req, config, models, traffic, req.growth, margin, say, progress)
    settings = report.Settings(
        source=list(req.events),
        config=str(req.config),
        growth=req.growth,
        window_s=window_s,
        margin=margin,
        margin_source=margin_source,
        seed=req.seed,
    )
    doc = report.plan_doc(settings, config, plans, traffic)
    header = (
        f"# vllm-obs plan: lane limits for growth x{req.growth:g} from {', '.join(req.events)}\n"
        f"# (plan.json beside this file says how each was found)\n"
    )
    written = report.write(req.out, doc, report.lanes_yaml(data, plans), header)
    if req.k8s is not None:
        recorded = plans
        if req.growth != 1:
            say("[plan] planning each pool for the recorded traffic too (--k8s: minReplicas)")
            recorded = _plan_pools(
                req, config, models, traffic, 1.0, margin, say, progress, tell_partial=False
            )
        written.append(autoscaler_bounds(req.k8s, recorded, plans, say))
    print(report.text(doc), file=stdout, end="")
    say(f"[plan] wrote {', '.join(str(p) for p in written)}")
    return 0 if doc["check"]["met"] else 1
