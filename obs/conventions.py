"""Every metric, label and bucket name the project exports or queries.

Exporters, dashboards and alert rules import names from here and nowhere
else; a test checks that every generated PromQL expression names only metrics
defined in this module (or vLLM's own, listed in ``VLLM_METRICS``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

NAMESPACE: Final = "vllm_obs"

# Label names.
LANE: Final = "lane"
POOL: Final = "pool"
REPLICA: Final = "replica"
MODEL: Final = "model"
PHASE: Final = "phase"
OUTCOME: Final = "outcome"
FINISH_REASON: Final = "finish_reason"
REASON: Final = "reason"
ERROR_CLASS: Final = "error_class"
EXPORTER: Final = "exporter"
RESULT: Final = "result"
LIMIT: Final = "limit"
ENGINE: Final = "engine"
FINGERPRINT: Final = "fingerprint"
CHANGED: Final = "changed"
OLD: Final = "old"
NEW: Final = "new"
CONFIG_HASH: Final = "config_hash"
CONFIG_VERSION: Final = "config_version"

# The five request phases, in order (see obs.phases).
PHASES: Final = ("queue", "prefill", "first_token", "decode", "stream")

# Request outcomes: the ``outcome`` label and the event's ``status`` field.
OK: Final = "ok"  # answered by the pool with a 2xx and relayed in full
ERROR: Final = "error"  # failed for a server-side reason (upstream error, timeout, relay fault)
CLIENT_ERROR: Final = "client_error"  # the pool answered 4xx: the request was bad
REJECTED: Final = "rejected"  # refused by the sidecar's admission policy
DISCONNECTED: Final = "client_disconnect"  # the client went away before the end
OUTCOMES: Final = (OK, ERROR, CLIENT_ERROR, REJECTED, DISCONNECTED)
# Outcomes that count against availability: only failures that are the service's fault.
BAD_OUTCOMES: Final = (ERROR,)

# Admission rejection reasons: the ``reason`` label of admission_rejections and the
# event's ``rejection_reason``. The HTTP status each answers with is in obs.sidecar.admission.
QUEUE_FULL: Final = "queue_full"  # 429: the lane's queue holds max_queue requests already
QUEUE_TIMEOUT: Final = "queue_timeout"  # 429: waited queue_timeout_s without a slot
TENANT_SHARE: Final = "tenant_share"  # 429: the tenant holds its fair share of a full lane
PROMPT_TOO_LONG: Final = "prompt_too_long"  # 413: estimated prompt over max_prompt_tokens
OVER_TOKEN_BUDGET: Final = "over_token_budget"  # 413: prompt + max_tokens over token_budget
POOL_UNAVAILABLE: Final = "pool_unavailable"  # 503: no replica of the pool accepts connections
ENGINE_QUEUE_FULL: Final = "engine_queue_full"  # 503 from vLLM itself (--max-num-queued-reqs)
REJECTION_REASONS: Final = (
    QUEUE_FULL,
    QUEUE_TIMEOUT,
    TENANT_SHARE,
    PROMPT_TOO_LONG,
    OVER_TOKEN_BUDGET,
    POOL_UNAVAILABLE,
    ENGINE_QUEUE_FULL,
)

# Where an event's token counts came from: the event's ``tokens_source``.
TOKENS_FROM_USAGE: Final = "usage"  # the pool's usage object (exact)
TOKENS_COUNTED: Final = "counted"  # no usage: output frames relayed, one token each (see events)
TOKENS_FROM_ENGINE: Final = "engine"  # no usage frame: the engine's joined span (exact)

OVERFLOW_LABEL: Final = "other"
MAX_MODEL_LABELS: Final = 32
# finish_reason label values: OpenAI's and vLLM's; anything else a pool sends is "other".
FINISH_REASONS: Final = (
    "stop", "length", "tool_calls", "function_call", "content_filter", "abort", "error",
    "repetition", "none",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Metric:
    """One exported metric: its full name, type, help text and label names."""

    name: str
    kind: str  # counter | histogram | gauge
    help: str
    labels: tuple[str, ...]

    @property
    def series(self) -> tuple[str, ...]:
        """The sample names Prometheus stores for this metric."""
        if self.kind == "counter":
            return (f"{self.name}_total",)
        if self.kind == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)


def _m(name: str, kind: str, help_: str, *labels: str) -> Metric:
    return Metric(f"{NAMESPACE}_{name}", kind, help_, labels)


LP = (LANE, POOL)

REQUESTS = _m(
    "requests",
    "counter",
    "Requests finished by the sidecar, by outcome and finish reason.",
    *LP,
    MODEL,
    OUTCOME,
    FINISH_REASON,
)
REQUEST_DURATION = _m(
    "request_duration_seconds", "histogram", "End-to-end time seen by the sidecar.", *LP
)
PHASE_DURATION = _m(
    "phase_duration_seconds",
    "histogram",
    "Time spent in each request phase (queue, prefill, first_token, decode, stream).",
    *LP,
    PHASE,
)
TTFT = _m(
    "ttft_seconds",
    "histogram",
    "Time to first token: request received to first output byte handed to the client.",
    *LP,
)
TPOT = _m(
    "tpot_seconds",
    "histogram",
    "Time per output token after the first: (last - first token) / (output tokens - 1).",
    *LP,
)
ITL = _m("itl_seconds", "histogram", "Gaps between consecutive output chunks from the pool.", *LP)
STREAM_BLOCKED = _m(
    "stream_blocked_seconds",
    "histogram",
    "Time the relay spent blocked writing to a slow client, per request.",
    *LP,
)
PROMPT_TOKENS = _m("prompt_tokens", "counter", "Prompt tokens, as the pool reported.", *LP)
CACHED_TOKENS = _m("cached_tokens", "counter", "Prompt tokens served from the prefix cache.", *LP)
COMPLETION_TOKENS = _m("completion_tokens", "counter", "Output tokens relayed.", *LP)
ADMISSION_REJECTIONS = _m(
    "admission_rejections",
    "counter",
    "Requests refused by the lane's admission policy, by reason (every lane and reason from 0).",
    LANE,
    REASON,
)
UPSTREAM_ERRORS = _m(
    "upstream_errors", "counter", "Failures talking to the pool, by error class.", *LP, ERROR_CLASS
)
CLIENT_DISCONNECTS = _m(
    "client_disconnects", "counter", "Clients that went away before the response ended.", *LP
)
IN_FLIGHT = _m("in_flight_requests", "gauge", "Requests dispatched to the pool, per lane.", LANE)
QUEUED = _m("queued_requests", "gauge", "Requests waiting for admission, per lane.", LANE)
LANE_INFO = _m(
    "lane_info", "gauge", "Always 1: maps each lane to its pool (join on pool).", LANE, POOL
)

# Per-pool engine state, read from each replica's /metrics at scrape time.
POOL_UP = _m(
    "pool_up", "gauge", "1 if the replica's /metrics answered at the last scrape.", POOL, REPLICA
)
POOL_KV_CACHE_USAGE = _m(
    "pool_kv_cache_usage_ratio", "gauge", "KV cache usage (0-1) of the replica.", POOL, REPLICA
)
POOL_RUNNING = _m(
    "pool_requests_running", "gauge", "Requests running in the replica's engine.", POOL, REPLICA
)
POOL_WAITING = _m(
    "pool_requests_waiting", "gauge", "Requests waiting in the replica's engine.", POOL, REPLICA
)
POOL_PREFIX_QUERIES = _m(
    "pool_prefix_cache_queries",
    "counter",
    "Prompt tokens looked up in the replica's prefix cache.",
    POOL,
    REPLICA,
)
POOL_PREFIX_HITS = _m(
    "pool_prefix_cache_hits",
    "counter",
    "Prompt tokens found in the replica's prefix cache.",
    POOL,
    REPLICA,
)
POOL_PREEMPTIONS = _m(
    "pool_preemptions", "counter", "Requests preempted by the replica's engine.", POOL, REPLICA
)
POOL_ENGINE_INFO = _m(
    "pool_engine_info",
    "gauge",
    "Always 1: the engine serving the replica (vllm, sglang, llamacpp, tgi, or unknown).",
    POOL,
    REPLICA,
    ENGINE,
)
# What each replica runs and the sidecar's own config (obs.served; docs/runbook.md "After a
# tuning change"). The info series also carries one label per setting the engine reports
# (obs.served.SETTING_KEYS), and none for a setting it does not.
POOL_SETTINGS_INFO = _m(
    "pool_settings_info",
    "gauge",
    "Always 1: the engine, version and settings the replica reports, and their fingerprint "
    "(events' settings_fingerprint); one label per reported setting.",
    POOL,
    REPLICA,
    ENGINE,
    FINGERPRINT,
)
POOL_SETTINGS_CHANGED = _m(
    "pool_settings_changed_timestamp_seconds",
    "gauge",
    "Unix time the replica last came back with other settings: what changed, old and new "
    "values (one series per replica: its last change).",
    POOL,
    REPLICA,
    CHANGED,
    OLD,
    NEW,
)
CONFIG_INFO = _m(
    "config_info",
    "gauge",
    "Always 1: the lanes config the sidecar runs, as a short hash (events' "
    "config_fingerprint) and the config's version.",
    CONFIG_HASH,
    CONFIG_VERSION,
)

# The sidecar's own health.
EVENTS_WRITTEN = _m("events_written", "counter", "Request events written by an exporter.", EXPORTER)
EVENTS_DROPPED = _m(
    "events_dropped",
    "counter",
    "Request events an exporter could not write (queue full or I/O error).",
    EXPORTER,
    REASON,
)
EXPORTER_FAILURES = _m(
    "exporter_failures", "counter", "Exceptions raised inside an exporter.", EXPORTER
)
ENGINE_SPANS = _m(
    "engine_spans",
    "counter",
    "Engine request spans received (vLLM llm_request, SGLang, TGI), by join result: "
    "joined, late (its event was already written without the engine view), rejected "
    "(a number out of range, or no timing), or unknown (not a request the sidecar sent "
    "to a tracing pool).",
    RESULT,
)
EVENT_LOOP_LAG = _m(
    "event_loop_lag_seconds",
    "histogram",
    "How late the sidecar's event loop ran a timer (sampled every 100 ms): time a request "
    "arriving then waited for the relay before it was even read.",
)
# Sampling period of EVENT_LOOP_LAG and its buckets (a 2-core machine shows ~0.1 ms idle).
EVENT_LOOP_LAG_PERIOD_S: Final = 0.1
EVENT_LOOP_LAG_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
# Lag above which the relay itself is the bottleneck: the alert's default and the panel's line.
EVENT_LOOP_LAG_MAX_S: Final = 0.05
# Hardening (obs.sidecar.guard, obs.sidecar.traces; docs/security.md).
CONNECTION_LIMITS = _m(
    "connection_limits",
    "counter",
    "Client connections or requests cut by a sidecar limit, by limit (every limit from 0).",
    LIMIT,
)
CLIENT_CONNECTIONS = _m(
    "client_connections", "gauge", "Client connections open on the relay's port."
)
TRACE_EXPORTS_REFUSED = _m(
    "trace_exports_refused",
    "counter",
    "OTLP exports refused on /v1/traces, by reason (every reason from 0).",
    REASON,
)
REJECTED_EVENTS_SKIPPED = _m(
    "rejected_events_skipped",
    "counter",
    "Events of refused requests (401, 4xx before a lane) not written: over the record's rate.",
)

ALL_METRICS: Final = (
    REQUESTS,
    REQUEST_DURATION,
    PHASE_DURATION,
    TTFT,
    TPOT,
    ITL,
    STREAM_BLOCKED,
    PROMPT_TOKENS,
    CACHED_TOKENS,
    COMPLETION_TOKENS,
    ADMISSION_REJECTIONS,
    UPSTREAM_ERRORS,
    CLIENT_DISCONNECTS,
    IN_FLIGHT,
    QUEUED,
    LANE_INFO,
    POOL_UP,
    POOL_KV_CACHE_USAGE,
    POOL_RUNNING,
    POOL_WAITING,
    POOL_PREFIX_QUERIES,
    POOL_PREFIX_HITS,
    POOL_PREEMPTIONS,
    POOL_ENGINE_INFO,
    POOL_SETTINGS_INFO,
    POOL_SETTINGS_CHANGED,
    CONFIG_INFO,
    EVENTS_WRITTEN,
    EVENTS_DROPPED,
    EXPORTER_FAILURES,
    ENGINE_SPANS,
    EVENT_LOOP_LAG,
    CONNECTION_LIMITS,
    CLIENT_CONNECTIONS,
    TRACE_EXPORTS_REFUSED,
    REJECTED_EVENTS_SKIPPED,
)

# vLLM's own metrics (as of 0.32) that the sidecar reads or the dashboards query.
VLLM_KV_CACHE_USAGE: Final = "vllm:kv_cache_usage_perc"
VLLM_RUNNING: Final = "vllm:num_requests_running"
VLLM_WAITING: Final = "vllm:num_requests_waiting"
VLLM_PREFIX_QUERIES: Final = "vllm:prefix_cache_queries_total"
VLLM_PREFIX_HITS: Final = "vllm:prefix_cache_hits_total"
VLLM_PREEMPTIONS: Final = "vllm:num_preemptions_total"
VLLM_QUEUE_TIME: Final = "vllm:request_queue_time_seconds"
VLLM_PREFILL_TIME: Final = "vllm:request_prefill_time_seconds"
VLLM_DECODE_TIME: Final = "vllm:request_decode_time_seconds"
VLLM_TTFT: Final = "vllm:time_to_first_token_seconds"
VLLM_ITL: Final = "vllm:inter_token_latency_seconds"
VLLM_METRICS: Final = (
    VLLM_KV_CACHE_USAGE,
    VLLM_RUNNING,
    VLLM_WAITING,
    VLLM_PREFIX_QUERIES,
    VLLM_PREFIX_HITS,
    VLLM_PREEMPTIONS,
    VLLM_QUEUE_TIME,
    VLLM_PREFILL_TIME,
    VLLM_DECODE_TIME,
    VLLM_TTFT,
    VLLM_ITL,
)

# Other engines' own metrics that their adapters read (see obs.engines): SGLang's
# python/sglang/srt/metrics/collector.py, llama.cpp's tools/server/server-task.cpp
# (served with --metrics), TGI's router/src/server.rs and backends/v3/src.
SGLANG_TOKEN_USAGE: Final = "sglang:token_usage"
SGLANG_RUNNING: Final = "sglang:num_running_reqs"
SGLANG_WAITING: Final = "sglang:num_queue_reqs"
SGLANG_PROMPT_TOKENS: Final = "sglang:prompt_tokens_total"
SGLANG_CACHED_TOKENS: Final = "sglang:cached_tokens_total"
LLAMACPP_PROCESSING: Final = "llamacpp:requests_processing"
LLAMACPP_DEFERRED: Final = "llamacpp:requests_deferred"
LLAMACPP_PROMPT_TOKENS: Final = "llamacpp:prompt_tokens_total"
LLAMACPP_CACHED_TOKENS: Final = "llamacpp:prompt_tokens_cached_total"
TGI_BATCH_SIZE: Final = "tgi_batch_current_size"
TGI_QUEUE_SIZE: Final = "tgi_queue_size"

# Latency buckets in seconds; SLO thresholds from the config are merged in
# exactly (see ``latency_buckets``) so every threshold is a bucket boundary.
LATENCY_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    7.5,
    10.0,
    20.0,
    30.0,
    60.0,
    120.0,
)
TOKEN_LATENCY_BUCKETS: Final = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    1.0,
    2.0,
)


def merged_buckets(base: tuple[float, ...], thresholds_s: list[float]) -> tuple[float, ...]:
    """``base`` plus every threshold (seconds), sorted, de-duplicated."""
    return tuple(sorted({*base, *(round(t, 6) for t in thresholds_s)}))


def bucket_le(seconds: float) -> str:
    """The ``le`` label value prometheus_client writes for a bucket bound."""
    return repr(float(seconds))


class BoundedLabel:
    """Caps the distinct values a user-controlled label may take.

    Values in ``allowed`` (and those ``allow`` adds, up to ``MAX_MODEL_LABELS``)
    always pass; up to ``cap`` other distinct values pass in arrival order;
    anything after that folds into ``other``.
    """

    __slots__ = ("_allowed", "_cap", "_seen")

    def __init__(self, allowed: tuple[str, ...] = (), cap: int = MAX_MODEL_LABELS) -> None:
        self._allowed = frozenset(allowed)
        self._cap = cap
        self._seen: set[str] = set()

    def allow(self, values: tuple[str, ...]) -> None:
        """Known good values (e.g. the models a pool reports it serves) from now on."""
        new = [v for v in values if v not in self._allowed and len(v) <= 128]
        room = MAX_MODEL_LABELS - len(self._allowed)
        if new and room > 0:
            self._allowed = self._allowed | frozenset(new[:room])

    def __call__(self, value: str | None) -> str:
        if not value:
            return OVERFLOW_LABEL
        if value in self._allowed or value in self._seen:
            return value
        if len(self._seen) < self._cap and len(value) <= 128:
            self._seen.add(value)
            return value
        return OVERFLOW_LABEL


# Recording rules (generated by obs.alerts, read by dashboards). Labels: lane, slo.
# ``slo`` is one of SLO_KINDS; windows are Prometheus durations such as 5m or 1h.
SLO_KINDS: Final = ("ttft", "tpot", "availability")
RULE_PREFIX: Final = "vllm_obs"
SLO_PERIOD: Final = "30d"


def sli_error_rule(window: str) -> str:
    """Recording rule: share of the lane's requests that broke the SLO over ``window``."""
    return f"{RULE_PREFIX}:sli_error:ratio_rate{window}"


def burn_rate_rule(window: str) -> str:
    """Recording rule: error ratio over ``window`` divided by the error budget (1 - objective)."""
    return f"{RULE_PREFIX}:burn_rate:ratio_rate{window}"


SLO_OBJECTIVE_RULE: Final = f"{RULE_PREFIX}:slo_objective:ratio"
ERROR_BUDGET_REMAINING_RULE: Final = f"{RULE_PREFIX}:error_budget_remaining:ratio"
POOL_PREFIX_HIT_RATIO_RULE: Final = f"{RULE_PREFIX}:pool_prefix_cache_hit:ratio_rate5m"
LANE_REJECTION_RATIO_RULE: Final = f"{RULE_PREFIX}:lane_rejection:ratio_rate5m"

# Availability: outcomes left out of the SLI altogether (their own signals, not failures).
AVAILABILITY_EXCLUDED_OUTCOMES: Final = (REJECTED, DISCONNECTED)

# Labels the alert rules add (besides lane and pool).
SLO_LABEL: Final = "slo"
SEVERITY: Final = "severity"
LONG_WINDOW: Final = "long_window"
SHORT_WINDOW: Final = "short_window"

# Alert names (generated by obs.alerts); each has a section in docs/runbook.md.
ALERT_TTFT_BUDGET_BURN: Final = "VllmObsTTFTBudgetBurn"
ALERT_TPOT_BUDGET_BURN: Final = "VllmObsTPOTBudgetBurn"
ALERT_AVAILABILITY_BUDGET_BURN: Final = "VllmObsAvailabilityBudgetBurn"
BUDGET_BURN_ALERTS: Final = {
    "ttft": ALERT_TTFT_BUDGET_BURN,
    "tpot": ALERT_TPOT_BUDGET_BURN,
    "availability": ALERT_AVAILABILITY_BUDGET_BURN,
}
ALERT_KV_CACHE_USAGE_HIGH: Final = "VllmObsKVCacheUsageHigh"
ALERT_POOL_PREEMPTING: Final = "VllmObsPoolPreempting"
ALERT_POOL_REPLICA_DOWN: Final = "VllmObsPoolReplicaDown"
ALERT_POOL_DOWN: Final = "VllmObsPoolDown"
ALERT_POOL_ABSENT: Final = "VllmObsPoolAbsent"
ALERT_PREFIX_CACHE_HIT_RATIO_LOW: Final = "VllmObsPrefixCacheHitRatioLow"
ALERT_ADMISSION_REJECTIONS_HIGH: Final = "VllmObsAdmissionRejectionsHigh"
ALERT_QUEUE_WAIT_HIGH: Final = "VllmObsQueueWaitHigh"
ALERT_EVENTS_DROPPED: Final = "VllmObsEventsDropped"
ALERT_EXPORTER_FAILING: Final = "VllmObsExporterFailing"
ALERT_EVENT_LOOP_LAG_HIGH: Final = "VllmObsEventLoopLagHigh"
ALL_ALERTS: Final = (
    *BUDGET_BURN_ALERTS.values(),
    ALERT_KV_CACHE_USAGE_HIGH,
    ALERT_POOL_PREEMPTING,
    ALERT_POOL_REPLICA_DOWN,
    ALERT_POOL_DOWN,
    ALERT_POOL_ABSENT,
    ALERT_PREFIX_CACHE_HIT_RATIO_LOW,
    ALERT_ADMISSION_REJECTIONS_HIGH,
    ALERT_QUEUE_WAIT_HIGH,
    ALERT_EVENTS_DROPPED,
    ALERT_EXPORTER_FAILING,
    ALERT_EVENT_LOOP_LAG_HIGH,
)

# --- Span attributes (the OTLP encoder, exporters/otlp_proto.py; Tempo links in dashboards) ---
# OpenTelemetry semantic conventions: GenAI (gen_ai.*), HTTP, server, error.
ATTR_OPERATION: Final = "gen_ai.operation.name"
ATTR_SYSTEM: Final = "gen_ai.system"
ATTR_PROVIDER: Final = "gen_ai.provider.name"
ATTR_REQUEST_MODEL: Final = "gen_ai.request.model"
ATTR_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
ATTR_REQUEST_STREAM: Final = "gen_ai.request.stream"
ATTR_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
ATTR_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
ATTR_CACHED_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
ATTR_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
ATTR_HTTP_ROUTE: Final = "http.route"
ATTR_HTTP_METHOD: Final = "http.request.method"
ATTR_HTTP_STATUS: Final = "http.response.status_code"
ATTR_SERVER_ADDRESS: Final = "server.address"
ATTR_ERROR_TYPE: Final = "error.type"
# This project's own, under its namespace.
ATTR_LANE: Final = "vllm_obs.lane"
ATTR_POOL: Final = "vllm_obs.pool"
ATTR_REQUEST_ID: Final = "vllm_obs.request_id"
ATTR_STATUS: Final = "vllm_obs.status"
ATTR_TENANT: Final = "vllm_obs.tenant"
ATTR_TTFT_MS: Final = "vllm_obs.ttft_ms"
ATTR_TPOT_MS: Final = "vllm_obs.tpot_ms"
ATTR_STREAM_BLOCKED_MS: Final = "vllm_obs.stream_blocked_ms"
ATTR_REJECTION_REASON: Final = "vllm_obs.rejection_reason"
ATTR_PHASE: Final = "vllm_obs.phase"
