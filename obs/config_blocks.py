"""Blocks of a lanes config's pools and lanes beyond routing and SLOs: the engine flags a
pool declares, the thresholds of the alerts the production guides name, a pool's price, and
what a lane does with slow clients.

``obs.config`` parses them (and re-exports them); each is a strict model whose errors name
the field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from obs.durations import seconds

NAME_RE = r"^[a-z][a-z0-9_-]{0,39}$"
Name = Annotated[str, Field(pattern=NAME_RE)]
PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
Ratio = Annotated[float, Field(gt=0, lt=1)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# Which engine serves a pool (obs.engines.adapters): its adapter maps its /metrics to the pool
# state; ``auto`` detects it from the metric names each replica exports.
EngineKind = Literal["auto", "vllm", "sglang", "llamacpp", "tgi", "sim"]


class DeclaredEngine(_Model):
    """The engine flags a pool's replicas were started with, as the operator declares them
    (``engine: {kind: vllm, max_num_seqs: 64}``). They join the settings the replicas
    report (``obs.served``): their series, fingerprints and change annotations; where the
    engine also reports a setting, the sidecar checks the two agree."""

    max_num_seqs: PositiveInt | None = None
    max_num_batched_tokens: PositiveInt | None = None
    max_model_len: PositiveInt | None = None
    long_prefill_token_threshold: PositiveInt | None = None
    stream_interval: PositiveInt | None = None
    max_num_partial_prefills: PositiveInt | None = None
    max_long_partial_prefills: PositiveInt | None = None
    prefix_caching: bool | None = None

    def values(self) -> dict[str, object]:
        """The declared flags (those given), by name."""
        return self.model_dump(exclude_none=True)

    def serve_args(self) -> list[str]:
        """The declared flags as ``vllm serve`` arguments, in field order (``prefix_caching``:
        ``--enable-prefix-caching`` or ``--no-enable-prefix-caching``)."""
        out: list[str] = []
        for name, value in self.values().items():
            if isinstance(value, bool):
                out.append(f"--{'' if value else 'no-'}enable-{name.replace('_', '-')}")
            else:
                out += [serve_flag(name), str(value)]
        return out


def serve_flag(name: str) -> str:
    """The ``vllm serve`` flag of a declared setting: ``max_num_seqs`` -> ``--max-num-seqs``."""
    return "--" + name.replace("_", "-")


def declared_in_args(args: list[str]) -> dict[str, object]:
    """The settings a ``vllm serve`` argument list gives that a pool can declare, by name
    (``DeclaredEngine``'s fields): what a shipped serve line must agree with."""
    out: dict[str, object] = {}
    words = [w for a in args for w in a.split("=", 1)] if args else []
    for i, word in enumerate(words):
        for name, field in DeclaredEngine.model_fields.items():
            if field.annotation == bool | None:
                flag = serve_flag(name).replace("--", "--enable-", 1)
                if word in (flag, flag.replace("--enable-", "--no-enable-", 1)):
                    out[name] = not word.startswith("--no-")
            elif word == serve_flag(name) and i + 1 < len(words):
                out[name] = int(words[i + 1])
    return out


def engine_block(data: Any) -> Any:
    """``engine: {kind: K, FLAG: V, ...}`` -> ``engine: K`` and ``declared: {FLAG: V}``."""
    if not isinstance(data, dict) or not isinstance(data.get("engine"), dict):
        return data
    if "declared" in data:
        raise ValueError("declared: give the flags in the engine block (engine: {kind: ...})")
    block = dict(data["engine"])
    return {**data, "engine": block.pop("kind", "auto"), "declared": block}


class Price(_Model):
    """What a pool costs, for ``query summary``'s cost per 1k tokens: its GPU-hour price (per
    GPU), GPUs per replica, and the API price per 1k tokens it is compared with (optional)."""

    gpu_hour: PositiveFloat
    gpus_per_replica: PositiveInt = 1
    api_per_1k_tokens: PositiveFloat | None = None


def _duration_text(v: str) -> str:
    seconds(v)  # raises ValueError naming the bad duration
    return v


Duration = Annotated[str, AfterValidator(_duration_text)]


class LaneAlerts(_Model):
    """A lane's thresholds for the alerts the production guides name (their numbers)."""

    e2e_p99_max_s: PositiveFloat = 30.0  # p99 end-to-end latency, every lane (batch too)
    # Share of the answers asked to be JSON (json_object/json_schema, tools) that do not parse.
    invalid_json_ratio_max: Ratio = 0.05
    # Requests a burn-rate or ratio alert needs in its window before it may fire (the short
    # window of a burn-rate alert: the same rate); fewer is not evidence (obs.alerts.model).
    min_requests: PositiveInt = 20


class PoolAlerts(_Model):
    """A pool's thresholds for the alerts the production guides name (their numbers)."""

    # Requests waiting in one replica's engine; unset: the declared max_num_seqs, else 100.
    engine_waiting_max: PositiveInt = 100
    # Generated tokens/s over 5m below this share of the same ``throughput_baseline`` before.
    throughput_drop_ratio: Ratio = 0.5
    throughput_baseline: Duration = "1h"


NonNegativeInt = Annotated[int, Field(ge=0)]
# The default waiting-requests target per replica of a pool admitted by saturation: a couple
# of requests queued in the engine keep its batch full between polls, more only add TTFT.
DEFAULT_MAX_WAITING = 2


class Saturation(_Model):
    """Admission by the pool's own measured state (``obs.sidecar.policy.saturation``): each
    sidecar process admits a request to the pool only while its estimate of every replica's
    waiting queue is under ``max_waiting``; the rest wait in the pool's one queue
    (``obs.sidecar.policy.pool_queue``), highest priority band first, then by weighted fair
    share of the lanes and tenants, each for its lane's ``queue_timeout_s``."""

    max_waiting: NonNegativeInt = DEFAULT_MAX_WAITING  # target per replica
    # Once held, admit again only when the estimate is this many requests under the target.
    hysteresis: NonNegativeInt = 1
    # A replica whose KV cache is this full admits nothing new until a poll shows less
    # (None: KV usage does not gate).
    kv_cache_usage_max: Ratio | None = None
    # A replica's last poll older than this (default: 3 poll intervals) is stale: the
    # process then admits on its own in-flight requests alone (as if it were the only sender).
    stale_after_s: PositiveFloat | None = None
    max_queue: NonNegativeInt = 256  # requests waiting in the pool's queue, all lanes
    # Fair-share weights of the pool's lanes (default 1 each); tenants' are in ``tenants:``.
    lane_weights: dict[str, PositiveFloat] = Field(default_factory=dict)


class PoolBlocks(_Model):
    """The fields of a pool (``obs.config.Pool``) this module adds: its declared engine flags
    (from its ``engine:`` block), the KV alert's hold, its alert thresholds, its price and
    its admission by saturation."""

    declared: DeclaredEngine | None = None
    saturation: Saturation | None = None
    # How long KV usage stays above kv_cache_usage_max (free blocks below the rest) before
    # the alert fires.
    kv_cache_usage_for: Duration = "5m"
    alerts: PoolAlerts = PoolAlerts()
    price: Price | None = None

    @model_validator(mode="before")
    @classmethod
    def _engine(cls, data: Any) -> Any:
        return engine_block(data)

    @model_serializer(mode="wrap")
    def _one_engine_block(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        declared = out.pop("declared", None)
        if declared:
            out["engine"] = {"kind": getattr(self, "engine", "auto"), **declared}
        return out


class LaneBlocks(_Model):
    """The fields of a lane (``obs.config.Lane``) this module adds: its alert thresholds."""

    alerts: LaneAlerts = LaneAlerts()


class SlowClient(_Model):
    """Per-stream buffer bound and what to do when a slow reader fills it."""

    buffer_bytes: PositiveInt = 1 << 20
    policy: Literal["wait", "abort"] = "wait"
    # Under "wait": the longest a stream waits on a client that reads nothing; then it ends
    # (error slow_client) and the client's connection is closed, freeing the lane's slot.
    max_blocked_s: PositiveFloat = 60.0
    # The longest the record waits, after a stream's last byte, for the client's side to
    # acknowledge it; then the event is written with client_unread_bytes (docs/record.md).
    record_wait_s: PositiveFloat = 30.0


class RateLimit(_Model):
    """Requests and tokens (prompt + completion; completion charged as ``max_tokens`` on
    admission and corrected on finish) a tenant or an API key may use in any minute
    (``obs.sidecar.policy.rate_limit``)."""

    requests_per_minute: PositiveInt | None = None
    tokens_per_minute: PositiveInt | None = None


class Tenant(RateLimit):
    """A tenant's rate limits and its weight in a saturated pool's fair share."""

    weight: PositiveFloat = 1.0


class RateLimits(_Model):
    """Where the rate-limit counters live: in each process (default; each process holds the
    whole limit), or in Redis (``redis://HOST:PORT/DB``), shared by every worker and sidecar
    replica. ``on_store_error``: when Redis cannot be reached within ``timeout_s``, ``open``
    admits the request (counted in ``rate_limit_store_errors_total``, which alerts) and
    ``closed`` refuses it with 503. ``default``: the limits of every tenant not named under
    ``tenants:`` (each its own window), and of requests naming no tenant (one window for all
    of them); without it they are not limited."""

    store: Annotated[str, Field(pattern=r"^rediss?://")] | None = None
    on_store_error: Literal["open", "closed"] = "open"
    timeout_s: PositiveFloat = 0.25
    default: RateLimit | None = None

    @field_validator("default")
    @classmethod
    def _limits_something(cls, default: RateLimit | None) -> RateLimit | None:
        if default is not None and not (default.requests_per_minute or default.tokens_per_minute):
            raise ValueError(
                "it limits nothing: give it requests_per_minute, "
                "tokens_per_minute or both (or leave it out: unlisted tenants are unlimited)"
            )
        return default


class AlertSettings(_Model):
    """The generated alerts' settings for the whole config (``vllm-obs alerts``)."""

    # The runbook as responders open it (https://.../docs/runbook.md): alerts link to
    # ``URL#<alertname lower-cased>``; ``vllm-obs alerts --runbook-url`` overrides it.
    runbook_base_url: Annotated[str, Field(pattern=r"^https?://")] | None = None


class ClickHouseExport(_Model):
    """The sidecar's ClickHouse event exporter (``--clickhouse-url`` and friends override)."""

    url: Annotated[str, Field(pattern=r"^https?://")]
    table: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$")] = (
        "vllm_obs.events"
    )
    spool: str | None = None  # spool file; default: clickhouse-spool.jsonl beside the events
    spool_max_mb: PositiveFloat = 1024


class HealthCheck(_Model):
    path: str = "/health"
    interval_s: PositiveFloat = 5.0


class ApiKey(RateLimit):
    """A client API key, stored as its SHA-256 (``vllm-obs config hash-key``), its tenant, and
    its own rate limits (``requests_per_minute``, ``tokens_per_minute``; beside its tenant's)."""

    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    tenant: Name


class Auth(_Model):
    """Who the client is. With ``api_keys``, requests without a listed key get 401."""

    api_keys: list[ApiKey] = Field(default_factory=list)
    # A header naming the tenant, set by a gateway you trust; used when no key names one.
    tenant_header: Annotated[str, Field(pattern=r"^[A-Za-z0-9-]{1,64}$")] | None = None

    @field_validator("api_keys")
    @classmethod
    def _unique(cls, keys: list[ApiKey]) -> list[ApiKey]:
        hashes = [k.sha256 for k in keys]
        if len(set(hashes)) != len(hashes):
            raise ValueError("the same key hash is listed twice")
        return keys
