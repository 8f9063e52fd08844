"""The sidecar's settings: parsed once at the edge into one typed object."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from obs.config import ClickHouseExport, Config
from obs.sidecar import defaults as D
from obs.sidecar.record.capture import TextCapture
from obs.sidecar.server.limits import Limits
from obs.sidecar.server.worker_metrics import WorkerSlot


@dataclass(frozen=True, slots=True)
class Settings:
    config: Config
    host: str = D.HOST
    port: int = D.PORT
    events_path: Path | None = Path(D.EVENTS)
    events_max_bytes: int = D.EVENTS_MAX_MB << 20
    events_backups: int = D.EVENTS_BACKUPS
    events_flush_interval_s: float = D.EVENTS_FLUSH_INTERVAL_S  # the JSONL writer's interval
    otlp_endpoint: str | None = None  # None: the standard OTEL_* variables decide
    otlp_metrics_endpoint: str | None = None  # GenAI metrics; None: OTEL_..._METRICS_ENDPOINT
    otlp_logs_endpoint: str | None = None  # events as log records; None: OTEL_..._LOGS_ENDPOINT
    pool_poll_interval_s: float = D.POOL_POLL_INTERVAL_S
    max_body_bytes: int = 32 << 20
    shutdown_grace_s: float = D.SHUTDOWN_GRACE_S
    log_level: str = D.LOG_LEVEL
    engine_join_wait_s: float = D.ENGINE_JOIN_WAIT_S  # longest an event waits for its span
    extra_routes: tuple[str, ...] = field(default=())
    metrics_address: tuple[str, int] | None = None  # /metrics there instead of on the relay port
    capture: TextCapture | None = None  # None: no prompt or output text anywhere (the default)
    workers: int = D.WORKERS  # relay processes on the port (obs.sidecar.server.workers)
    worker: WorkerSlot | None = None  # set in each worker when workers > 1
    clickhouse: ClickHouseExport | None = None  # None: no ClickHouse exporter
    # Hardening (docs/security.md).
    limits: Limits = field(default_factory=Limits)  # per client connection
    health_address: tuple[str, int] | None = None  # /health on its own listener too
    traces_token_env: str | None = None  # env var with a token that may POST /v1/traces
    max_json_elements: int = 200_000  # JSON values a large request body may hold
    rejected_events_per_s: float = 50.0  # client-caused events before a pool written one by one
    max_tenants_per_client: int = 8  # header tenants one address brings a minute (0: any)
    split_salt: bytes = b""  # keys the split lanes' arm hash (obs.splits); secret
