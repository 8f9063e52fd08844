"""The sidecar's own metrics: one ``Metric`` per exported family, with its labels."""

from __future__ import annotations

from typing import Final

from obs.conventions.family import Metric, _m
from obs.conventions.labels import (
    ARM,
    BAND,
    CAUSE,
    CHANGED,
    CLASS_SOURCE,
    CONFIG_HASH,
    CONFIG_VERSION,
    ENGINE,
    ERROR_CLASS,
    EXPORTER,
    FINGERPRINT,
    FINISH_REASON,
    GATE,
    KIND,
    LANE,
    LIMIT,
    MODEL,
    NEW,
    OLD,
    OUTCOME,
    PHASE,
    POOL,
    REASON,
    REPLICA,
    RESULT,
    SETTING,
    STAGE,
    TENANT,
)
from obs.conventions.rules import SLO_LABEL

LP = (LANE, POOL)
_LPRT = (LANE, POOL, REPLICA, TENANT)

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
    "Time to first token: request received to the first token chunk handed to the client.",
    *LP,
)
TPOT = _m(
    "tpot_seconds",
    "histogram",
    "Time per output token after the first: (last - first token) / (output tokens - 1).",
    *LP,
)
# The histograms whose samples carry the request's trace id as an exemplar (label
# ``EXEMPLAR_TRACE_ID``): the latency panels of these show points that open the trace.
EXEMPLAR_METRICS = (TTFT, TPOT, REQUEST_DURATION)
ITL = _m("itl_seconds", "histogram", "Gaps between consecutive output chunks from the pool.", *LP)
# One observation per streamed request with two chunks or more: the ITL SLO's indicator
# (``slo: {itl: ...}``), as TTFT and TPOT are theirs.
ITL_REQUEST_P95 = _m(
    "itl_request_p95_seconds",
    "histogram",
    "Per streamed request: the 95th percentile of its gaps between consecutive output chunks "
    "(the event's itl_p95_ms); the ITL SLO is judged on it.",
    *LP,
)
STREAM_BLOCKED = _m(
    "stream_blocked_seconds",
    "histogram",
    "Time the relay spent blocked writing to a slow client, per request.",
    *LP,
)
PROMPT_TOKENS = _m("prompt_tokens", "counter", "Prompt tokens, as the pool reported.", *LP)
CACHED_TOKENS = _m("cached_tokens", "counter", "Prompt tokens served from the prefix cache.", *LP)
COMPLETION_TOKENS = _m("completion_tokens", "counter", "Output tokens relayed.", *LP)
JSON_ANSWERS = _m(
    "json_answers",
    "counter",
    "Answers to requests that asked for JSON (response_format json_object/json_schema, or "
    "tools), by whether they parse (result valid or invalid; obs.sidecar.relay.json_answers).",
    *LP,
    MODEL,
    RESULT,
)
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
# Not ``vllm_obs_pool_*``: across --workers these are summed (each worker holds its own requests).
OCCUPANCY_REQUESTS: Final = _m(
    "replica_lane_requests",
    "gauge",
    "Requests the sidecar has in flight on a replica, per lane and tenant.",
    *_LPRT,
)
OCCUPANCY_PREFILL_TOKENS: Final = _m(
    "replica_lane_prefill_tokens",
    "gauge",
    "Estimated prompt tokens (request bytes / 4) of the requests in flight on a replica that "
    "have no first token yet (waiting or prefilling), per lane and tenant.",
    *_LPRT,
)
OCCUPANCY_DECODING: Final = _m(
    "replica_lane_decoding",
    "gauge",
    "Sequences decoding on a replica (in flight, first token seen), per lane and tenant.",
    *_LPRT,
)
OCCUPANCY_METRICS: Final = (OCCUPANCY_REQUESTS, OCCUPANCY_PREFILL_TOKENS, OCCUPANCY_DECODING)
QUEUED = _m("queued_requests", "gauge", "Requests waiting for admission, per lane.", LANE)
LANE_INFO = _m(
    "lane_info", "gauge", "Always 1: maps each lane to its pool (join on pool).", LANE, POOL
)
LANE_ARM_REQUESTS = _m(
    "lane_arm_requests",
    "counter",
    "Requests of a split lane by the arm its client's identity chose (the arm's pool, also "
    "when a fallback pool answered), by outcome (every lane arm and outcome from 0).",
    LANE,
    ARM,
    OUTCOME,
)
FALLBACKS = _m(
    "fallbacks",
    "counter",
    "Requests the lane sent to its fallback pool, by the pool that failed them and why "
    "(every lane, pool and reason from 0).",
    LANE,
    POOL,
    REASON,
)

# Flow control (docs/flow.md): a pool's admission by saturation and the tenants' rate limits.
FLOW_QUEUED = _m(
    "flow_queued_requests",
    "gauge",
    "Requests waiting in a saturated pool's one queue, by priority band.",
    POOL,
    BAND,
)
FLOW_HELD = _m(
    "flow_saturation_held",
    "gauge",
    "1 while the pool is held at its saturation target (requests wait or are refused), per "
    "sidecar process (summed: the processes holding it).",
    POOL,
)
FLOW_HELD_REQUESTS = _m(
    "flow_held_requests",
    "counter",
    "Requests that waited in a pool's queue for room, by the bound that held them (waiting, "
    "kv_cache, stale, no_replica).",
    POOL,
    GATE,
)
RATE_LIMIT = _m(
    "rate_limit_per_minute",
    "gauge",
    "A tenant's configured limit per minute, by kind (requests, tokens).",
    TENANT,
    KIND,
)
RATE_LIMIT_USED = _m(
    "rate_limit_charged",
    "counter",
    "What a tenant was charged: requests on admission, tokens (prompt + completion) as used "
    "when the request finished.",
    TENANT,
    KIND,
)
RATE_LIMITED = _m(
    "rate_limited_requests",
    "counter",
    "Requests refused (429) by a tenant's or key's rate limit, by the tenant and the kind "
    "of limit that refused.",
    TENANT,
    KIND,
)
RATE_LIMIT_STORE_ERRORS = _m(
    "rate_limit_store_errors",
    "counter",
    "Requests whose rate-limit store (Redis) did not answer (admitted uncounted when failing "
    "open, refused 503 when closed).",
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
# Cold starts (obs.sidecar.pools): a replica that was down (a failed poll or a refused
# connection) coming back, per stage.
POOL_COLD_START = _m(
    "pool_cold_start_seconds",
    "gauge",
    "The replica's last cold start: seconds from its first failure (failed poll or refused "
    "connection) to its first healthy poll (stage healthy) and to the first token it served "
    "after that (stage first_token).",
    POOL,
    REPLICA,
    STAGE,
)
POOL_COLD_STARTS = _m(
    "pool_cold_starts",
    "counter",
    "Times the replica came back (its first healthy poll) after being down.",
    POOL,
    REPLICA,
)
POOL_ENGINE_INFO = _m(
    "pool_engine_info",
    "gauge",
    "Always 1: the engine serving the replica (vllm, sglang, llamacpp, tgi, sim, or unknown).",
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
POOL_SETTINGS_DRIFT = _m(
    "pool_settings_drift",
    "gauge",
    "1 when the replica reports another value of a setting than its pool declares "
    "(obs.served.drift), 0 when they agree; one series per declared setting it reports.",
    POOL,
    REPLICA,
    SETTING,
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
# Hardening (obs.sidecar.server.guard, obs.sidecar.relay.traces; docs/security.md).
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
    "Events of client-caused outcomes (refusals, 4xx before a pool, disconnects before a pool) "
    "not written one by one: over the record's rate; summary records count them.",
)
CLASSIFIED = _m(
    "classified",
    "counter",
    "Requests put in a lane, by what decided it (source: header, rule, learned, default).",
    LANE,
    CLASS_SOURCE,
)
SLOW_READERS = _m(
    "slow_readers",
    "gauge",
    "Clients the sidecar learned read their streams slowly (routed by slow_reader rules).",
)
REFUSED_SUMMARIES = _m(
    "refused_summaries",
    "counter",
    "Summary records written for client-caused events not written one by one.",
)
SLO_MISSES = _m(
    "slo_misses",
    "counter",
    "Requests that missed a gate of their lane's SLO, by the phase and cause they are "
    "attributed to (obs.attribution); a request missing two gates counts under each.",
    LANE,
    SLO_LABEL,
    PHASE,
    CAUSE,
)

# Every metric above, in the order defined (the metric table of docs/reference.md follows it:
# python -m obs.reference docs/reference.md regenerates it).
ALL_METRICS: Final[tuple[Metric, ...]] = tuple(
    v for v in list(globals().values()) if isinstance(v, Metric)
)
