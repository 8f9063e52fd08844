"""The lanes/SLO config: one YAML file parsed once into a typed, validated model.

Spec (YAML) -> model (this module) -> generators (alerts, dashboards, query)
-> writers. Unknown keys are errors; every error names the file and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from obs.config_blocks import (
    AlertSettings,
    Auth,
    ClickHouseExport,
    EngineKind,
    HealthCheck,
    LaneBlocks,
    Name,
    PoolBlocks,
    PositiveFloat,
    PositiveInt,
    RateLimits,
    Ratio,
    SlowClient,
    Tenant,
)
from obs.durations import seconds
from obs.errors import ConfigError
from obs.matching import Match, Recognition
from obs.splits import Canary, with_baseline

# The SRE-workbook multi-window, multi-burn-rate alerts: data, not code.
DEFAULT_BURN_WINDOWS: list[dict[str, object]] = [
    {"severity": "page", "long": "1h", "short": "5m", "factor": 14.4, "for": "2m"},
    {"severity": "page", "long": "6h", "short": "30m", "factor": 6.0, "for": "15m"},
    {"severity": "ticket", "long": "1d", "short": "2h", "factor": 3.0, "for": "1h"},
    {"severity": "ticket", "long": "3d", "short": "6h", "factor": 1.0, "for": "3h"},
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BurnWindow(_Model):
    severity: Literal["page", "ticket"]
    long: str
    short: str
    factor: PositiveFloat
    for_: str = Field(alias="for", default="0m")

    @field_validator("long", "short", "for_")
    @classmethod
    def _duration(cls, v: str) -> str:
        seconds(v)  # raises ValueError naming the bad duration
        return v


class LatencySLO(_Model):
    """``objective`` of requests complete within ``threshold_ms`` (0.95 = p95 <= threshold)."""

    threshold_ms: PositiveFloat
    objective: Ratio = 0.95


class AvailabilitySLO(_Model):
    """``objective`` of requests do not fail for a server-side reason."""

    objective: Ratio = 0.995


class SLO(_Model):
    ttft: LatencySLO | None = None
    tpot: LatencySLO | None = None
    # Each streamed request's p95 gap between output chunks (its itl_p95_ms) within the
    # threshold, for ``objective`` of them: the lab's TTFT/ITL gate.
    itl: LatencySLO | None = None
    availability: AvailabilitySLO | None = None
    # Alerting floor for the prefix-cache hit ratio of the lane's pool (lanes that expect reuse).
    cache_hit_ratio_min: Ratio | None = None
    burn_windows: list[BurnWindow] = Field(
        default_factory=lambda: [BurnWindow.model_validate(w) for w in DEFAULT_BURN_WINDOWS]
    )


class Admission(_Model):
    max_concurrency: PositiveInt | None = None
    max_queue: Annotated[int, Field(ge=0)] = 0
    queue_timeout_s: PositiveFloat = 5.0
    max_prompt_tokens: PositiveInt | None = None
    token_budget: PositiveInt | None = None  # in-flight prompt + max_tokens
    tenant_fair_share: bool = False
    slow_client: SlowClient = SlowClient()


class Timeouts(_Model):
    connect_s: PositiveFloat = 2.0
    first_token_s: PositiveFloat = 60.0
    idle_s: PositiveFloat = 30.0


class PriorityRule(_Model):
    """Requests matching ``match`` get ``priority``."""

    match: Match
    priority: Annotated[int, Field(ge=0, le=9)]


class Priority(_Model):
    """A request's priority in its lane, 0-9 (obs.sidecar.policy.priority): the ``header``'s digit
    (off unless named; never above the tenant's level), else the tenant's, else the first
    matching rule's, else ``default``; a queued request gains one level per ``aging_s``
    seconds."""

    # Clients' own priority header (one ASCII digit): off unless named; capped at the tenant's.
    header: Annotated[str, Field(pattern=r"^[A-Za-z0-9-]{1,64}$")] | None = None
    tenants: dict[Name, Annotated[int, Field(ge=0, le=9)]] = Field(default_factory=dict)
    rules: list[PriorityRule] = Field(default_factory=list)
    default: Annotated[int, Field(ge=0, le=9)] = 0
    aging_s: PositiveFloat = 2.0


class Lane(LaneBlocks):
    name: Name
    # The lane's pool; with ``split`` it is filled in as the baseline arm (never give both).
    pool: Name
    # Weighted arms: pool -> weight, in place of ``pool`` (obs.splits).
    split: dict[Name, PositiveInt] | None = None
    # Where a request goes when the lane's pool refuses it, answers 5xx or times out before
    # its first byte (never once streaming started).
    fallback: Name | None = None
    canary: Canary | None = None
    priority: Priority | None = None
    description: str = ""
    match: list[Match] = Field(default_factory=list)
    routing: Literal["least_outstanding", "prefix_affinity"] = "least_outstanding"
    admission: Admission = Admission()
    timeouts: Timeouts = Timeouts()
    slo: SLO = SLO()

    @model_validator(mode="before")
    @classmethod
    def _split_or_pool(cls, data: object) -> object:
        return with_baseline(data)

    @model_validator(mode="after")
    def _canary_needs_split(self) -> Lane:
        if self.canary is not None and self.split is None:
            raise ValueError("canary: only a lane with a split has arms to judge")
        if self.fallback is not None and self.split is None and self.fallback == self.pool:
            raise ValueError(
                f"fallback: pool {self.fallback!r} is the lane's own pool (a fallback loop)"
            )
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        out: dict[str, object] = handler(self)
        if self.split is not None:
            out.pop("pool", None)  # implied by the split: dumps validate again
        return out

    @property
    def arms(self) -> tuple[tuple[str, int], ...]:
        """(pool, weight) of each arm, as configured; one arm of weight 1 without a split."""
        return tuple(self.split.items()) if self.split else ((self.pool, 1),)

    @property
    def canaries(self) -> tuple[str, ...]:
        """The arms judged against the baseline (``pool``): every arm but the baseline."""
        return tuple(p for p, _ in self.arms if p != self.pool)

    @property
    def canary_policy(self) -> Canary:
        return self.canary or Canary()

    @property
    def pools(self) -> tuple[str, ...]:
        """Every pool the lane may send a request to: its arms, then its fallback."""
        names = [p for p, _ in self.arms]
        if self.fallback is not None and self.fallback not in names:
            names.append(self.fallback)
        return tuple(names)


class Pool(PoolBlocks):
    name: Name
    replicas: list[str] = Field(min_length=1)
    model: str | None = None
    api_key_env: str | None = None  # name of the env var holding the pool's API key
    # True when the pool's engine exports its request spans to this sidecar (vLLM, SGLang,
    # TGI: obs.engines.spans; llama.cpp has none): events then wait for the engine view.
    engine_traces: bool = False
    # Which engine serves the pool (its adapter; ``auto``: detected), and its flags: PoolBlocks
    engine: EngineKind = "auto"
    health: HealthCheck = HealthCheck()
    # False for replicas that serve no Prometheus /metrics (a hosted OpenAI-compatible API as a
    # fallback): their health comes from a GET of ``health.path`` (``/v1/models`` for most
    # hosted APIs), their engine state is unknown, and no saturation alert is judged on them.
    metrics: bool = True
    kv_cache_usage_max: Ratio = 0.9

    @field_validator("replicas")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        out = []
        for u in urls:
            parts = urlsplit(u)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"{u!r} is not an http(s) URL like http://127.0.0.1:8000")
            try:
                parts.port  # noqa: B018  (raises on a bad port)
            except ValueError as e:
                raise ValueError(f"{u!r} has a bad port") from e
            out.append(u.rstrip("/"))
        return out

    @model_validator(mode="after")
    def _spans(self) -> Pool:
        if self.engine_traces and self.engine == "llamacpp":
            raise ValueError("engine_traces: llama.cpp's llama-server exports no spans")
        if self.saturation is not None and (
            self.declared is None or self.declared.max_num_seqs is None
        ):
            raise ValueError(
                "saturation: admission by saturation reads running requests against the "
                "pool's max_num_seqs; declare it (engine: {kind: ..., max_num_seqs: N})"
            )
        return self


class Config(_Model):
    version: Literal[1] = 1
    pools: list[Pool] = Field(min_length=1)
    lanes: list[Lane] = Field(min_length=1)
    default_lane: Name
    auth: Auth = Auth()
    clickhouse: ClickHouseExport | None = None
    recognition: Recognition = Recognition()
    # Per-tenant rate limits and fair-share weights, by the tenant auth resolves.
    tenants: dict[Name, Tenant] = Field(default_factory=dict)
    rate_limits: RateLimits = RateLimits()
    alerts: AlertSettings = AlertSettings()  # the generated alerts' (obs.alerts)

    @model_validator(mode="after")
    def _references(self) -> Config:
        for kind, names in (("pool", [p.name for p in self.pools]), ("lane", self.lane_names)):
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"duplicate {kind} name(s): {', '.join(dupes)}")
        pools = {p.name for p in self.pools}
        for lane in self.lanes:
            for pool in lane.pools:
                if pool not in pools:
                    raise ValueError(
                        f"lane {lane.name!r} routes to unknown pool {pool!r} "
                        f"(pools: {', '.join(sorted(pools))})"
                    )
        if self.default_lane not in self.lane_names:
            raise ValueError(f"default_lane {self.default_lane!r} is not a lane")
        slow_ms = self.recognition.slow_stream_ms
        for lane in self.lanes:  # a stream recorded before its client took it all is slow
            if lane.admission.slow_client.record_wait_s * 1000 < slow_ms:
                raise ValueError(
                    f"lane {lane.name!r}: admission.slow_client.record_wait_s "
                    f"({lane.admission.slow_client.record_wait_s:g} s) is below "
                    f"recognition.slow_stream_ms ({slow_ms:g} ms): a stream the record stopped "
                    "waiting for must read as a slow reader's"
                )
        for p in self.pools:
            weights = p.saturation.lane_weights if p.saturation is not None else {}
            unknown = sorted(set(weights) - set(self.lane_names))
            if unknown:
                raise ValueError(
                    f"pool {p.name!r}: saturation.lane_weights names unknown lane(s) "
                    f"{', '.join(unknown)}"
                )
        return self

    @property
    def lane_names(self) -> list[str]:
        return [lane.name for lane in self.lanes]

    def lane(self, name: str) -> Lane:
        return next(lane for lane in self.lanes if lane.name == name)

    def pool(self, name: str) -> Pool:
        return next(p for p in self.pools if p.name == name)

    def slo_thresholds_s(self, which: Literal["ttft", "tpot", "itl"]) -> list[float]:
        """Every latency threshold of that kind, in seconds (for histogram buckets)."""
        out = []
        for lane in self.lanes:
            slo = getattr(lane.slo, which)
            if slo is not None:
                out.append(slo.threshold_ms / 1000)
        return out


def single_upstream(url: str, model: str | None = None, engine_traces: bool = False) -> Config:
    """The config ``--upstream URL`` implies: one pool, one lane, both named default."""
    try:
        return Config.model_validate(
            {
                "pools": [
                    {
                        "name": "default",
                        "replicas": [url],
                        "model": model,
                        "engine_traces": engine_traces,
                    }
                ],
                "lanes": [{"name": "default", "pool": "default"}],
                "default_lane": "default",
            }
        )
    except ValidationError as e:
        raise ConfigError(f"--upstream: {_first_error(e)}") from e


def _first_error(e: ValidationError) -> str:
    return "; ".join(_describe(err) for err in e.errors())


def _describe(err: object) -> str:
    assert isinstance(err, dict)
    loc = ".".join(str(p) for p in err.get("loc", ())).replace(".declared.", ".engine.")
    msg = str(err.get("msg", "invalid"))
    msg = msg.removeprefix("Value error, ")
    if err.get("type") == "extra_forbidden":
        msg = "unknown key"
    return f"{loc}: {msg}" if loc else msg


def validation_error(source: str, what: str, e: ValidationError) -> ConfigError:
    """A ``ConfigError`` naming ``source`` and, one per line, each invalid field and why."""
    lines = [f"  {_describe(err)}" for err in e.errors()]
    return ConfigError(f"{source}: invalid {what}\n" + "\n".join(lines))


def parse_config(data: object, source: str = "<config>") -> Config:
    """Validate already-loaded YAML/JSON data; errors name ``source`` and each field."""
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise validation_error(source, "config", e) from e


def read_yaml(path: str | Path, what: str = "config") -> object:
    """The YAML data of a file; a ConfigError naming the file when it cannot be read."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{p}: cannot read {what}: {e.strerror or e}") from e
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from e


def load_config(path: str | Path) -> Config:
    """Read and validate a lanes YAML file."""
    return parse_config(read_yaml(path), str(path))


def default_config_path() -> Path:
    """The shipped default config for the six request classes."""
    return Path(__file__).parent / "data" / "lanes.yaml"
