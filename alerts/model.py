"""The alerting model: what to record and alert on, derived once from the lanes/SLO config.

Spec (``obs.config.Config``) -> this model -> rule and test generators -> writer.
Burn windows and health thresholds are data here, never code in the generators.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Final

from obs import conventions as c
from obs.config import Config, Lane, Pool
from obs.durations import seconds
from obs.engines.adapters import ADAPTERS, reports
from obs.engines.metrics import STATE_FIELDS
from obs.errors import ConfigError
from obs.slo import Objective, objectives

# Where the runbook lives in the repository; alerts link to its sections. Without a base URL
# (the lanes config's alerts.runbook_base_url, or --runbook-url) the links are this relative
# path, which a pager cannot open: `vllm-obs alerts` warns.
RUNBOOK_PATH: Final = "docs/runbook.md"
# Requests a burn-rate or ratio alert needs in its window (lanes config: alerts.min_requests).
DEFAULT_MIN_REQUESTS: Final = 20
# What the alerts' `vllm-obs query budget` command reads: the responder puts in the
# sidecar's event log (its --events JSONL) or its clickhouse://HOST:8123/DB.TABLE.
EVENTS_PLACEHOLDER: Final = "EVENTS"


@dataclass(frozen=True, slots=True)
class Window:
    """One multi-window burn-rate alert: fire when both windows burn above ``factor``."""

    severity: str
    long: str
    short: str
    factor: float
    for_: str


@dataclass(frozen=True, slots=True)
class SLI(Objective):
    """One declared SLO of one lane, with the burn windows that alert on it."""

    windows: tuple[Window, ...]
    # Requests the long window of each burn-rate alert needs (the short window: the same
    # rate), so a handful of requests is never evidence (the lane's alerts.min_requests).
    min_requests: int = DEFAULT_MIN_REQUESTS

    def floor(self, w: Window, window: str) -> int:
        """Requests ``window`` (``w.long`` or ``w.short``) needs: ``min_requests`` in the
        long window, the same rate in the short one (at least 1)."""
        if window == w.long:
            return self.min_requests
        return max(1, math.ceil(self.min_requests * seconds(window) / seconds(w.long)))

    @property
    def rule_windows(self) -> tuple[str, ...]:
        """Every window the alerts read, shortest first."""
        found = {w for win in self.windows for w in (win.short, win.long)}
        return tuple(sorted(found, key=seconds))

    @property
    def alert(self) -> str:
        """The alert name for this kind of SLO."""
        return c.BUDGET_BURN_ALERTS[self.kind]


@dataclass(frozen=True, slots=True)
class LaneHealth:
    """A lane's saturation thresholds."""

    lane: str
    pool: str
    queue_wait_max_s: float
    cache_hit_ratio_min: float | None
    e2e_p99_max_s: float = 30.0
    invalid_json_ratio_max: float = 0.05
    # The lane's canary margins and request floor, which also judge a settings change.
    ttft_p95_margin: float = 0.15
    tpot_p95_margin: float = 0.15
    min_requests: int = 100
    # Requests a ratio alert of the lane needs in its window (alerts.min_requests).
    alert_min_requests: int = DEFAULT_MIN_REQUESTS
    # The latency SLOs the lane declares (a settings change is judged only on those), and
    # whether its requests ask for JSON (its match rules, or its own invalid_json_ratio_max).
    latency_slos: tuple[str, ...] = ("ttft", "tpot")
    asks_json: bool = True


@dataclass(frozen=True, slots=True)
class PoolHealth:
    """A pool's replicas and saturation thresholds, and what its engine reports."""

    pool: str
    replicas: tuple[str, ...]
    kv_cache_usage_max: float
    engine: str = "auto"
    reports: frozenset[str] = frozenset(STATE_FIELDS)
    """Pool-state fields its engine reports (its adapter): no alert is judged on the rest."""
    kv_cache_usage_for: str = "5m"
    engine_waiting_max: float = 100
    throughput_drop_ratio: float = 0.5
    throughput_baseline: str = "1h"
    min_requests: int = DEFAULT_MIN_REQUESTS  # the least of its lanes' alerts.min_requests


@dataclass(frozen=True, slots=True)
class Policy:
    """Severity and hold time (``for``) of one health alert."""

    severity: str
    for_: str


# Health alerts: severity and how long the condition must hold before it fires.
HEALTH_POLICY: Final = {
    c.ALERT_KV_CACHE_USAGE_HIGH: Policy("ticket", "5m"),  # each pool's kv_cache_usage_for
    c.ALERT_POOL_PREEMPTING: Policy("ticket", "15m"),
    c.ALERT_POOL_REPLICA_DOWN: Policy("ticket", "5m"),
    c.ALERT_POOL_DOWN: Policy("page", "2m"),
    c.ALERT_POOL_ABSENT: Policy("page", "5m"),
    c.ALERT_PREFIX_CACHE_HIT_RATIO_LOW: Policy("ticket", "30m"),
    c.ALERT_ADMISSION_REJECTIONS_HIGH: Policy("ticket", "10m"),
    c.ALERT_QUEUE_WAIT_HIGH: Policy("ticket", "10m"),
    c.ALERT_EVENTS_DROPPED: Policy("ticket", "10m"),
    c.ALERT_EXPORTER_FAILING: Policy("ticket", "10m"),
    c.ALERT_EVENT_LOOP_LAG_HIGH: Policy("ticket", "10m"),
    c.ALERT_CANARY_ROLLBACK: Policy("ticket", "10m"),
    c.ALERT_TENANT_AT_RATE_LIMIT: Policy("ticket", "10m"),
    c.ALERT_POOL_HELD_AT_SATURATION: Policy("ticket", "10m"),
    # A ticket when the store fails open (limits lifted); a page when it fails closed
    # (every limited request refused 503): obs.alerts.flow_rules.
    c.ALERT_RATE_LIMIT_STORE_DOWN: Policy("ticket", "5m"),
    c.ALERT_ENGINE_QUEUE_DEEP: Policy("ticket", "5m"),
    c.ALERT_E2E_LATENCY_HIGH: Policy("ticket", "10m"),
    c.ALERT_THROUGHPUT_DROP: Policy("ticket", "15m"),
    c.ALERT_ENGINE_SETTINGS_DRIFT: Policy("ticket", "10m"),
    c.ALERT_INVALID_JSON_HIGH: Policy("ticket", "10m"),
    c.ALERT_SETTINGS_CHANGE_REGRESSION: Policy("ticket", "10m"),
    c.ALERT_GPU_MEMORY_HIGH: Policy("ticket", "10m"),
    c.ALERT_GPU_UTILISATION_OUT_OF_BAND: Policy("ticket", "30m"),
    c.ALERT_SPEC_DECODE_ACCEPTANCE_DROP: Policy("ticket", "15m"),
    c.ALERT_REPLICA_OUTLIER: Policy("ticket", "5m"),  # obs.alerts.replica_rules
    c.ALERT_GPU_XID: Policy("page", "3m"),  # obs.alerts.gpu_fault_rules
    c.ALERT_GPU_ECC: Policy("page", "3m"),
    c.ALERT_GPU_THROTTLED: Policy("ticket", "10m"),
}


@dataclass(frozen=True, slots=True)
class HealthThresholds:
    """Thresholds the lanes config does not carry (one value for every lane and pool)."""

    rejection_ratio_max: float = 0.05  # share of a lane's requests refused, per reason
    queue_wait_quantile: float = 0.95
    # Queue wait alert: this share of the lane's TTFT threshold, or of its queue timeout
    # when that is smaller or the lane has no TTFT SLO.
    queue_wait_share: float = 0.5
    preemptions_per_s_max: float = 0.0  # any sustained preemption
    rate_window: str = "5m"  # matches the ``_rate5m`` recording rule names
    # The sidecar's event loop: p99 lag above this many seconds means requests wait in the
    # relay itself (CPU-bound process: add --workers or cores).
    loop_lag_quantile: float = 0.99
    loop_lag_max_s: float = c.EVENT_LOOP_LAG_MAX_S
    # A settings change judged like a canary (obs.alerts.change_rules): p95 over the last
    # ``change_after`` against p95 over ``change_before`` ending ``change_recent`` ago, while
    # the pool's last settings change is younger than ``change_recent``.
    change_after: str = "15m"
    change_before: str = "1h"
    change_recent: str = "1h"
    # GPUs (dcgm-exporter): frame buffer used over total above this (vLLM itself takes its
    # --gpu-memory-utilization, 0.9 by default, at start), and utilisation outside the band
    # the production guide aims at under load (70-95%); the low bound only while requests flow.
    gpu_memory_used_max: float = 0.97
    gpu_util_low: float = 0.70
    gpu_util_high: float = 0.95
    # Speculative decoding: accepted over proposed draft tokens over ``spec_window`` below this
    # share of the same ratio over the hour before.
    spec_window: str = "15m"
    spec_acceptance_drop_ratio: float = 0.7


@dataclass(frozen=True, slots=True)
class CanaryArm:
    """One canary arm of a split lane, judged against the lane's baseline arm."""

    lane: str
    baseline: str
    canary: str
    ttft_p95_margin: float
    tpot_p95_margin: float
    min_requests: int
    window: str
    availability_objective: float | None


@dataclass(frozen=True, slots=True)
class AlertModel:
    """Everything the rule generators need, and nothing else."""

    slis: tuple[SLI, ...]
    lanes: tuple[LaneHealth, ...]
    pools: tuple[PoolHealth, ...]
    thresholds: HealthThresholds = field(default_factory=HealthThresholds)
    runbook_url: str = RUNBOOK_PATH
    canaries: tuple[CanaryArm, ...] = ()  # split lanes' canary arms (obs.alerts.canary_rules)
    events: str = EVENTS_PLACEHOLDER  # what the alerts' `vllm-obs query budget` reads
    # Flow control (obs.alerts.flow_rules): rate-limited tenants and saturated pools.
    limited_tenants: tuple[str, ...] = ()
    saturated_pools: tuple[str, ...] = ()
    # The shared rate-limit store (Redis), if any, and what a request gets when it fails.
    rate_limit_store: bool = False
    store_fails_closed: bool = False

    def lane_slis(self, lane: str) -> tuple[SLI, ...]:
        """The SLIs of one lane, in ``SLO_KINDS`` order."""
        return tuple(s for s in self.slis if s.lane == lane)

    @property
    def slo_lanes(self) -> tuple[str, ...]:
        """Lanes that declare at least one SLO, in config order."""
        return tuple(dict.fromkeys(s.lane for s in self.slis))

    def runbook(self, alert: str) -> str:
        """The URL of the runbook section for ``alert`` (GitHub-style anchor)."""
        return f"{self.runbook_url}#{alert.lower()}"


def build_model(
    config: Config,
    runbook_url: str = RUNBOOK_PATH,
    thresholds: HealthThresholds | None = None,
) -> AlertModel:
    """Derive the alerting model; raise ``ConfigError`` for SLOs no alert could catch."""
    th = thresholds or HealthThresholds()
    slis = tuple(s for lane in config.lanes for s in _slis(lane))
    pools = tuple(
        PoolHealth(
            p.name,
            tuple(p.replicas),
            p.kv_cache_usage_max,
            p.engine,
            reports(p.engine) if p.metrics else frozenset(),
            p.kv_cache_usage_for,
            _engine_waiting_max(p),
            p.alerts.throughput_drop_ratio,
            p.alerts.throughput_baseline,
        )
        for p in config.pools
    )
    pools = tuple(replace(p, min_requests=_pool_floor(config, p.pool)) for p in pools)
    hits = {p.pool for p in pools if "prefix_hits" in p.reports and _usage_cached(p.engine)}
    lanes = tuple(
        LaneHealth(
            lane=lane.name,
            pool=lane.pool,
            queue_wait_max_s=_queue_wait_max_s(lane, th),
            # A pool whose engine counts no prefix-cache hits, or never puts cached tokens in
            # its answers' usage (the lane's own ratio), cannot be judged on a floor.
            cache_hit_ratio_min=lane.slo.cache_hit_ratio_min if lane.pool in hits else None,
            e2e_p99_max_s=_e2e_max_s(lane),
            invalid_json_ratio_max=lane.alerts.invalid_json_ratio_max,
            ttft_p95_margin=lane.canary_policy.ttft_p95_margin,
            tpot_p95_margin=lane.canary_policy.tpot_p95_margin,
            min_requests=lane.canary_policy.min_requests,
            alert_min_requests=lane.alerts.min_requests,
            latency_slos=tuple(k for k in ("ttft", "tpot") if getattr(lane.slo, k) is not None),
            asks_json=_asks_json(lane),
        )
        for lane in config.lanes
    )
    return AlertModel(
        slis,
        lanes,
        pools,
        th,
        runbook_url,
        _canaries(config),
        limited_tenants=tuple(
            name
            for name, t in config.tenants.items()
            if t.requests_per_minute or t.tokens_per_minute
        ),
        saturated_pools=tuple(p.name for p in config.pools if p.saturation is not None),
        rate_limit_store=config.rate_limits.store is not None,
        store_fails_closed=config.rate_limits.on_store_error == "closed",
    )


def runbook_base(config: Config, override: str | None) -> str | None:
    """The runbook's URL: ``--runbook-url``, else the config's ``alerts.runbook_base_url``."""
    return override or config.alerts.runbook_base_url


def _usage_cached(engine: str) -> bool:
    """Whether answers of ``engine`` can carry ``usage.prompt_tokens_details.cached_tokens``
    (the sidecar's per-lane cached_tokens): not TGI's or the simulator's (their adapters say
    null); ``auto`` may be any engine."""
    adapter = ADAPTERS.get(engine)
    return adapter is None or not adapter.events.get("cached_tokens", "").startswith("null")


def _pool_floor(config: Config, pool: str) -> int:
    floors = [lane.alerts.min_requests for lane in config.lanes if pool in lane.pools]
    return min(floors, default=DEFAULT_MIN_REQUESTS)


JSON_FORMATS: Final = frozenset({"json_object", "json_schema"})


def _asks_json(lane: Lane) -> bool:
    """Whether the lane's requests ask for JSON: a match rule on tools or a JSON
    ``response_format``, or the lane sets its own ``alerts.invalid_json_ratio_max``."""
    if "invalid_json_ratio_max" in lane.alerts.model_fields_set:
        return True
    return any(m.tools or JSON_FORMATS & set(m.response_format or ()) for m in lane.match)


def _engine_waiting_max(pool: Pool) -> int:
    """The engine-queue bound: ``alerts.engine_waiting_max`` when set, else the pool's declared
    ``max_num_seqs`` (a queue a whole batch long), else the guide's 100."""
    declared = pool.declared.max_num_seqs if pool.declared else None
    if "engine_waiting_max" in pool.alerts.model_fields_set or declared is None:
        return pool.alerts.engine_waiting_max
    return declared


def _canaries(config: Config) -> tuple[CanaryArm, ...]:
    out = []
    for lane in config.lanes:
        policy = lane.canary_policy
        objective = lane.slo.availability.objective if lane.slo.availability else None
        for arm in lane.canaries:
            out.append(
                CanaryArm(
                    lane.name,
                    lane.pool,
                    arm,
                    policy.ttft_p95_margin,
                    policy.tpot_p95_margin,
                    policy.min_requests,
                    policy.window,
                    objective,
                )
            )
    return tuple(out)


def _slis(lane: Lane) -> list[SLI]:
    windows = tuple(
        Window(w.severity, w.long, w.short, w.factor, w.for_) for w in lane.slo.burn_windows
    )
    out = []
    for o in objectives(lane):
        sli = SLI(
            o.lane, o.pool, o.kind, o.objective, o.threshold_ms, windows, lane.alerts.min_requests
        )
        _check(sli)
        out.append(sli)
    return out


def _check(sli: SLI) -> None:
    where = f"lanes[{sli.lane}].slo"
    for i, w in enumerate(sli.windows):
        if seconds(w.short) >= seconds(w.long):
            raise ConfigError(
                f"{where}.burn_windows[{i}]: short window {w.short} must be shorter "
                f"than the long window {w.long}"
            )
        if w.factor * sli.budget >= 1:
            raise ConfigError(
                f"{where}.{sli.kind}: objective {sli.objective:g} leaves an error budget of "
                f"{sli.budget:g}, so burn window {w.long}/{w.short} at {w.factor:g}x would need "
                f"more than 100% of requests to fail and can never fire; lower the factor "
                f"(burn_windows[{i}]) or raise the objective"
            )


def _e2e_max_s(lane: Lane) -> float:
    """The lane's p99 end-to-end threshold, below the last finite latency bucket (where
    histogram_quantile can still report more)."""
    high = c.LATENCY_BUCKETS[-2]
    if lane.alerts.e2e_p99_max_s > high:
        raise ConfigError(
            f"lanes[{lane.name}].alerts.e2e_p99_max_s: {lane.alerts.e2e_p99_max_s:g}s is above "
            f"{high:g}s, the highest latency a p99 can be told from (the histogram's last bucket)"
        )
    return lane.alerts.e2e_p99_max_s


def _queue_wait_max_s(lane: Lane, th: HealthThresholds) -> float:
    limit = lane.admission.queue_timeout_s
    if lane.slo.ttft is not None:
        limit = min(limit, lane.slo.ttft.threshold_ms / 1000)
    # histogram_quantile cannot report more than the last finite bucket bound, so the
    # threshold must sit below it to be reachable (and not below the first bound).
    low, high = c.LATENCY_BUCKETS[0], c.LATENCY_BUCKETS[-2]
    return round(min(max(limit * th.queue_wait_share, low), high), 6)
