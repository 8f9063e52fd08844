"""Every metric, label and bucket name the project exports or queries.

Exporters, dashboards and alert rules import names from here and nowhere
else; a test checks that every generated PromQL expression names only metrics
defined in this module (or vLLM's own, listed in ``VLLM_METRICS``).

The names live in submodules by kind (labels, metrics, engines, buckets, rules, spans);
import them from here: ``from obs import conventions as c``.
"""

from __future__ import annotations

from obs.conventions.buckets import (
    LATENCY_BUCKETS as LATENCY_BUCKETS,
)
from obs.conventions.buckets import (
    TOKEN_LATENCY_BUCKETS as TOKEN_LATENCY_BUCKETS,
)
from obs.conventions.buckets import (
    BoundedLabel as BoundedLabel,
)
from obs.conventions.buckets import (
    bucket_le as bucket_le,
)
from obs.conventions.buckets import (
    merged_buckets as merged_buckets,
)
from obs.conventions.engines import (
    LLAMACPP_CACHED_TOKENS as LLAMACPP_CACHED_TOKENS,
)
from obs.conventions.engines import (
    LLAMACPP_DEFERRED as LLAMACPP_DEFERRED,
)
from obs.conventions.engines import (
    LLAMACPP_PROCESSING as LLAMACPP_PROCESSING,
)
from obs.conventions.engines import (
    LLAMACPP_PROMPT_TOKENS as LLAMACPP_PROMPT_TOKENS,
)
from obs.conventions.engines import (
    SGLANG_CACHED_TOKENS as SGLANG_CACHED_TOKENS,
)
from obs.conventions.engines import (
    SGLANG_PROMPT_TOKENS as SGLANG_PROMPT_TOKENS,
)
from obs.conventions.engines import (
    SGLANG_RUNNING as SGLANG_RUNNING,
)
from obs.conventions.engines import (
    SGLANG_TOKEN_USAGE as SGLANG_TOKEN_USAGE,
)
from obs.conventions.engines import (
    SGLANG_WAITING as SGLANG_WAITING,
)
from obs.conventions.engines import (
    TGI_BATCH_SIZE as TGI_BATCH_SIZE,
)
from obs.conventions.engines import (
    TGI_QUEUE_SIZE as TGI_QUEUE_SIZE,
)
from obs.conventions.engines import (
    VLLM_DECODE_TIME as VLLM_DECODE_TIME,
)
from obs.conventions.engines import (
    VLLM_ITL as VLLM_ITL,
)
from obs.conventions.engines import (
    VLLM_KV_CACHE_USAGE as VLLM_KV_CACHE_USAGE,
)
from obs.conventions.engines import (
    VLLM_METRICS as VLLM_METRICS,
)
from obs.conventions.engines import (
    VLLM_PREEMPTIONS as VLLM_PREEMPTIONS,
)
from obs.conventions.engines import (
    VLLM_PREFILL_TIME as VLLM_PREFILL_TIME,
)
from obs.conventions.engines import (
    VLLM_PREFIX_HITS as VLLM_PREFIX_HITS,
)
from obs.conventions.engines import (
    VLLM_PREFIX_QUERIES as VLLM_PREFIX_QUERIES,
)
from obs.conventions.engines import (
    VLLM_QUEUE_TIME as VLLM_QUEUE_TIME,
)
from obs.conventions.engines import (
    VLLM_RUNNING as VLLM_RUNNING,
)
from obs.conventions.engines import (
    VLLM_TTFT as VLLM_TTFT,
)
from obs.conventions.engines import (
    VLLM_WAITING as VLLM_WAITING,
)
from obs.conventions.labels import (
    BAD_OUTCOMES as BAD_OUTCOMES,
)
from obs.conventions.labels import (
    CHANGED as CHANGED,
)
from obs.conventions.labels import (
    CLIENT_ERROR as CLIENT_ERROR,
)
from obs.conventions.labels import (
    CONFIG_HASH as CONFIG_HASH,
)
from obs.conventions.labels import (
    CONFIG_VERSION as CONFIG_VERSION,
)
from obs.conventions.labels import (
    DISCONNECTED as DISCONNECTED,
)
from obs.conventions.labels import (
    ENGINE as ENGINE,
)
from obs.conventions.labels import (
    ENGINE_QUEUE_FULL as ENGINE_QUEUE_FULL,
)
from obs.conventions.labels import (
    ERROR as ERROR,
)
from obs.conventions.labels import (
    ERROR_CLASS as ERROR_CLASS,
)
from obs.conventions.labels import (
    EXPORTER as EXPORTER,
)
from obs.conventions.labels import (
    FINGERPRINT as FINGERPRINT,
)
from obs.conventions.labels import (
    FINISH_REASON as FINISH_REASON,
)
from obs.conventions.labels import (
    FINISH_REASONS as FINISH_REASONS,
)
from obs.conventions.labels import (
    LANE as LANE,
)
from obs.conventions.labels import (
    LIMIT as LIMIT,
)
from obs.conventions.labels import (
    MAX_MODEL_LABELS as MAX_MODEL_LABELS,
)
from obs.conventions.labels import (
    MODEL as MODEL,
)
from obs.conventions.labels import (
    NAMESPACE as NAMESPACE,
)
from obs.conventions.labels import (
    NEW as NEW,
)
from obs.conventions.labels import (
    OK as OK,
)
from obs.conventions.labels import (
    OLD as OLD,
)
from obs.conventions.labels import (
    OUTCOME as OUTCOME,
)
from obs.conventions.labels import (
    OUTCOMES as OUTCOMES,
)
from obs.conventions.labels import (
    OVER_TOKEN_BUDGET as OVER_TOKEN_BUDGET,
)
from obs.conventions.labels import (
    OVERFLOW_LABEL as OVERFLOW_LABEL,
)
from obs.conventions.labels import (
    PHASE as PHASE,
)
from obs.conventions.labels import (
    PHASES as PHASES,
)
from obs.conventions.labels import (
    POOL as POOL,
)
from obs.conventions.labels import (
    POOL_UNAVAILABLE as POOL_UNAVAILABLE,
)
from obs.conventions.labels import (
    PROMPT_TOO_LONG as PROMPT_TOO_LONG,
)
from obs.conventions.labels import (
    QUEUE_FULL as QUEUE_FULL,
)
from obs.conventions.labels import (
    QUEUE_TIMEOUT as QUEUE_TIMEOUT,
)
from obs.conventions.labels import (
    REASON as REASON,
)
from obs.conventions.labels import (
    REJECTED as REJECTED,
)
from obs.conventions.labels import (
    REJECTION_REASONS as REJECTION_REASONS,
)
from obs.conventions.labels import (
    REPLICA as REPLICA,
)
from obs.conventions.labels import (
    RESULT as RESULT,
)
from obs.conventions.labels import (
    TENANT_SHARE as TENANT_SHARE,
)
from obs.conventions.labels import (
    TOKENS_COUNTED as TOKENS_COUNTED,
)
from obs.conventions.labels import (
    TOKENS_FROM_ENGINE as TOKENS_FROM_ENGINE,
)
from obs.conventions.labels import (
    TOKENS_FROM_USAGE as TOKENS_FROM_USAGE,
)
from obs.conventions.metrics import (
    ADMISSION_REJECTIONS as ADMISSION_REJECTIONS,
)
from obs.conventions.metrics import (
    ALL_METRICS as ALL_METRICS,
)
from obs.conventions.metrics import (
    CACHED_TOKENS as CACHED_TOKENS,
)
from obs.conventions.metrics import (
    CLIENT_CONNECTIONS as CLIENT_CONNECTIONS,
)
from obs.conventions.metrics import (
    CLIENT_DISCONNECTS as CLIENT_DISCONNECTS,
)
from obs.conventions.metrics import (
    COMPLETION_TOKENS as COMPLETION_TOKENS,
)
from obs.conventions.metrics import (
    CONFIG_INFO as CONFIG_INFO,
)
from obs.conventions.metrics import (
    CONNECTION_LIMITS as CONNECTION_LIMITS,
)
from obs.conventions.metrics import (
    ENGINE_SPANS as ENGINE_SPANS,
)
from obs.conventions.metrics import (
    EVENT_LOOP_LAG as EVENT_LOOP_LAG,
)
from obs.conventions.metrics import (
    EVENT_LOOP_LAG_BUCKETS as EVENT_LOOP_LAG_BUCKETS,
)
from obs.conventions.metrics import (
    EVENT_LOOP_LAG_MAX_S as EVENT_LOOP_LAG_MAX_S,
)
from obs.conventions.metrics import (
    EVENT_LOOP_LAG_PERIOD_S as EVENT_LOOP_LAG_PERIOD_S,
)
from obs.conventions.metrics import (
    EVENTS_DROPPED as EVENTS_DROPPED,
)
from obs.conventions.metrics import (
    EVENTS_WRITTEN as EVENTS_WRITTEN,
)
from obs.conventions.metrics import (
    EXPORTER_FAILURES as EXPORTER_FAILURES,
)
from obs.conventions.metrics import (
    IN_FLIGHT as IN_FLIGHT,
)
from obs.conventions.metrics import (
    ITL as ITL,
)
from obs.conventions.metrics import (
    LANE_INFO as LANE_INFO,
)
from obs.conventions.metrics import (
    LP as LP,
)
from obs.conventions.metrics import (
    PHASE_DURATION as PHASE_DURATION,
)
from obs.conventions.metrics import (
    POOL_ENGINE_INFO as POOL_ENGINE_INFO,
)
from obs.conventions.metrics import (
    POOL_KV_CACHE_USAGE as POOL_KV_CACHE_USAGE,
)
from obs.conventions.metrics import (
    POOL_PREEMPTIONS as POOL_PREEMPTIONS,
)
from obs.conventions.metrics import (
    POOL_PREFIX_HITS as POOL_PREFIX_HITS,
)
from obs.conventions.metrics import (
    POOL_PREFIX_QUERIES as POOL_PREFIX_QUERIES,
)
from obs.conventions.metrics import (
    POOL_RUNNING as POOL_RUNNING,
)
from obs.conventions.metrics import (
    POOL_SETTINGS_CHANGED as POOL_SETTINGS_CHANGED,
)
from obs.conventions.metrics import (
    POOL_SETTINGS_INFO as POOL_SETTINGS_INFO,
)
from obs.conventions.metrics import (
    POOL_UP as POOL_UP,
)
from obs.conventions.metrics import (
    POOL_WAITING as POOL_WAITING,
)
from obs.conventions.metrics import (
    PROMPT_TOKENS as PROMPT_TOKENS,
)
from obs.conventions.metrics import (
    QUEUED as QUEUED,
)
from obs.conventions.metrics import (
    REJECTED_EVENTS_SKIPPED as REJECTED_EVENTS_SKIPPED,
)
from obs.conventions.metrics import (
    REQUEST_DURATION as REQUEST_DURATION,
)
from obs.conventions.metrics import (
    REQUESTS as REQUESTS,
)
from obs.conventions.metrics import (
    STREAM_BLOCKED as STREAM_BLOCKED,
)
from obs.conventions.metrics import (
    TPOT as TPOT,
)
from obs.conventions.metrics import (
    TRACE_EXPORTS_REFUSED as TRACE_EXPORTS_REFUSED,
)
from obs.conventions.metrics import (
    TTFT as TTFT,
)
from obs.conventions.metrics import (
    UPSTREAM_ERRORS as UPSTREAM_ERRORS,
)
from obs.conventions.metrics import (
    Metric as Metric,
)
from obs.conventions.rules import (
    ALERT_ADMISSION_REJECTIONS_HIGH as ALERT_ADMISSION_REJECTIONS_HIGH,
)
from obs.conventions.rules import (
    ALERT_AVAILABILITY_BUDGET_BURN as ALERT_AVAILABILITY_BUDGET_BURN,
)
from obs.conventions.rules import (
    ALERT_EVENT_LOOP_LAG_HIGH as ALERT_EVENT_LOOP_LAG_HIGH,
)
from obs.conventions.rules import (
    ALERT_EVENTS_DROPPED as ALERT_EVENTS_DROPPED,
)
from obs.conventions.rules import (
    ALERT_EXPORTER_FAILING as ALERT_EXPORTER_FAILING,
)
from obs.conventions.rules import (
    ALERT_KV_CACHE_USAGE_HIGH as ALERT_KV_CACHE_USAGE_HIGH,
)
from obs.conventions.rules import (
    ALERT_POOL_ABSENT as ALERT_POOL_ABSENT,
)
from obs.conventions.rules import (
    ALERT_POOL_DOWN as ALERT_POOL_DOWN,
)
from obs.conventions.rules import (
    ALERT_POOL_PREEMPTING as ALERT_POOL_PREEMPTING,
)
from obs.conventions.rules import (
    ALERT_POOL_REPLICA_DOWN as ALERT_POOL_REPLICA_DOWN,
)
from obs.conventions.rules import (
    ALERT_PREFIX_CACHE_HIT_RATIO_LOW as ALERT_PREFIX_CACHE_HIT_RATIO_LOW,
)
from obs.conventions.rules import (
    ALERT_QUEUE_WAIT_HIGH as ALERT_QUEUE_WAIT_HIGH,
)
from obs.conventions.rules import (
    ALERT_TPOT_BUDGET_BURN as ALERT_TPOT_BUDGET_BURN,
)
from obs.conventions.rules import (
    ALERT_TTFT_BUDGET_BURN as ALERT_TTFT_BUDGET_BURN,
)
from obs.conventions.rules import (
    ALL_ALERTS as ALL_ALERTS,
)
from obs.conventions.rules import (
    AVAILABILITY_EXCLUDED_OUTCOMES as AVAILABILITY_EXCLUDED_OUTCOMES,
)
from obs.conventions.rules import (
    BUDGET_BURN_ALERTS as BUDGET_BURN_ALERTS,
)
from obs.conventions.rules import (
    ERROR_BUDGET_REMAINING_RULE as ERROR_BUDGET_REMAINING_RULE,
)
from obs.conventions.rules import (
    LANE_REJECTION_RATIO_RULE as LANE_REJECTION_RATIO_RULE,
)
from obs.conventions.rules import (
    LONG_WINDOW as LONG_WINDOW,
)
from obs.conventions.rules import (
    POOL_PREFIX_HIT_RATIO_RULE as POOL_PREFIX_HIT_RATIO_RULE,
)
from obs.conventions.rules import (
    RULE_PREFIX as RULE_PREFIX,
)
from obs.conventions.rules import (
    SEVERITY as SEVERITY,
)
from obs.conventions.rules import (
    SHORT_WINDOW as SHORT_WINDOW,
)
from obs.conventions.rules import (
    SLO_KINDS as SLO_KINDS,
)
from obs.conventions.rules import (
    SLO_LABEL as SLO_LABEL,
)
from obs.conventions.rules import (
    SLO_OBJECTIVE_RULE as SLO_OBJECTIVE_RULE,
)
from obs.conventions.rules import (
    SLO_PERIOD as SLO_PERIOD,
)
from obs.conventions.rules import (
    burn_rate_rule as burn_rate_rule,
)
from obs.conventions.rules import (
    sli_error_rule as sli_error_rule,
)
from obs.conventions.spans import (
    ATTR_CACHED_INPUT_TOKENS as ATTR_CACHED_INPUT_TOKENS,
)
from obs.conventions.spans import (
    ATTR_ERROR_TYPE as ATTR_ERROR_TYPE,
)
from obs.conventions.spans import (
    ATTR_FINISH_REASONS as ATTR_FINISH_REASONS,
)
from obs.conventions.spans import (
    ATTR_HTTP_METHOD as ATTR_HTTP_METHOD,
)
from obs.conventions.spans import (
    ATTR_HTTP_ROUTE as ATTR_HTTP_ROUTE,
)
from obs.conventions.spans import (
    ATTR_HTTP_STATUS as ATTR_HTTP_STATUS,
)
from obs.conventions.spans import (
    ATTR_INPUT_TOKENS as ATTR_INPUT_TOKENS,
)
from obs.conventions.spans import (
    ATTR_LANE as ATTR_LANE,
)
from obs.conventions.spans import (
    ATTR_OPERATION as ATTR_OPERATION,
)
from obs.conventions.spans import (
    ATTR_OUTPUT_TOKENS as ATTR_OUTPUT_TOKENS,
)
from obs.conventions.spans import (
    ATTR_PHASE as ATTR_PHASE,
)
from obs.conventions.spans import (
    ATTR_POOL as ATTR_POOL,
)
from obs.conventions.spans import (
    ATTR_PROVIDER as ATTR_PROVIDER,
)
from obs.conventions.spans import (
    ATTR_REJECTION_REASON as ATTR_REJECTION_REASON,
)
from obs.conventions.spans import (
    ATTR_REQUEST_ID as ATTR_REQUEST_ID,
)
from obs.conventions.spans import (
    ATTR_REQUEST_MAX_TOKENS as ATTR_REQUEST_MAX_TOKENS,
)
from obs.conventions.spans import (
    ATTR_REQUEST_MODEL as ATTR_REQUEST_MODEL,
)
from obs.conventions.spans import (
    ATTR_REQUEST_STREAM as ATTR_REQUEST_STREAM,
)
from obs.conventions.spans import (
    ATTR_SERVER_ADDRESS as ATTR_SERVER_ADDRESS,
)
from obs.conventions.spans import (
    ATTR_STATUS as ATTR_STATUS,
)
from obs.conventions.spans import (
    ATTR_STREAM_BLOCKED_MS as ATTR_STREAM_BLOCKED_MS,
)
from obs.conventions.spans import (
    ATTR_SYSTEM as ATTR_SYSTEM,
)
from obs.conventions.spans import (
    ATTR_TENANT as ATTR_TENANT,
)
from obs.conventions.spans import (
    ATTR_TPOT_MS as ATTR_TPOT_MS,
)
from obs.conventions.spans import (
    ATTR_TTFT_MS as ATTR_TTFT_MS,
)
