"""Label names and the label values the project bounds: phases, outcomes, rejection reasons,
token sources, finish reasons."""

from __future__ import annotations

from typing import Final

NAMESPACE: Final = "vllm_obs"

# Label names.
# The exemplar label holding a request's trace id (Grafana's exemplarTraceIdDestinations name).
EXEMPLAR_TRACE_ID: Final = "trace_id"
LANE: Final = "lane"
POOL: Final = "pool"
REPLICA: Final = "replica"
MODEL: Final = "model"
PHASE: Final = "phase"
STAGE: Final = "stage"  # a cold start's stage: healthy, first_token (COLD_START_STAGES)
COLD_START_STAGES: Final = ("healthy", "first_token")
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
ARM: Final = "arm"  # the pool a split lane's arm sends to (bounded by the config's pools)
SETTING: Final = "setting"  # a declared engine setting (obs.served.DRIFT_CHECKS)
CLASS_SOURCE: Final = "source"
TENANT: Final = "tenant"  # a tenant named in the config's ``tenants:`` (bounded by it)
BAND: Final = "band"  # a request's priority band, 0-9
GATE: Final = "gate"  # which bound of a pool's saturation held a request (GATES)
KIND: Final = "kind"  # a rate limit's kind: requests or tokens

# Which bound of a pool's saturation held a request (obs.sidecar.policy.saturation): the
# ``gate`` label and the event's ``admission_gate`` (``pool:GATE``; ``lane`` and
# ``rate_limit`` name the other gates).
SATURATION_GATES: Final = ("waiting", "kv_cache", "stale", "no_replica")
RATE_LIMIT_KINDS: Final = ("requests", "tokens")

# What put a request in its lane: the ``source`` label and the event's ``class_source``.
CLASS_SOURCES: Final = ("header", "rule", "learned", "default")
# The ``result`` of json_answers: whether an answer asked to be JSON parses.
JSON_VALID: Final = "valid"
JSON_INVALID: Final = "invalid"

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
# event's ``rejection_reason``. The HTTP status each answers with is in
# obs.sidecar.policy.admission.
QUEUE_FULL: Final = "queue_full"  # 429: the lane's queue holds max_queue requests already
QUEUE_TIMEOUT: Final = "queue_timeout"  # 429: waited queue_timeout_s without a slot
TENANT_SHARE: Final = "tenant_share"  # 429: the tenant holds its fair share of a full lane
PROMPT_TOO_LONG: Final = "prompt_too_long"  # 413: estimated prompt over max_prompt_tokens
OVER_TOKEN_BUDGET: Final = "over_token_budget"  # 413: prompt + max_tokens over token_budget
POOL_UNAVAILABLE: Final = "pool_unavailable"  # 503: no replica of the pool accepts connections
ENGINE_QUEUE_FULL: Final = "engine_queue_full"  # 503 from vLLM itself (--max-num-queued-reqs)
# 429: the lane's queue was full and a request of higher priority took this one's place.
LOWER_PRIORITY: Final = "lower_priority"
# 429: the tenant or API key is at its requests (tokens) per minute (obs.sidecar.policy.rate_limit).
RATE_LIMIT_REQUESTS: Final = "rate_limit_requests"
RATE_LIMIT_TOKENS: Final = "rate_limit_tokens"
# 503: the rate-limit store (Redis) did not answer and rate_limits.on_store_error is closed.
RATE_LIMIT_STORE: Final = "rate_limit_store"
# 429: the pool is saturated (obs.sidecar.policy.saturation) and its queue is full, or the
# request waited its lane's queue_timeout_s in it.
POOL_QUEUE_FULL: Final = "pool_queue_full"
POOL_QUEUE_TIMEOUT: Final = "pool_queue_timeout"
REJECTION_REASONS: Final = (
    QUEUE_FULL,
    QUEUE_TIMEOUT,
    TENANT_SHARE,
    PROMPT_TOO_LONG,
    OVER_TOKEN_BUDGET,
    POOL_UNAVAILABLE,
    ENGINE_QUEUE_FULL,
    LOWER_PRIORITY,
    RATE_LIMIT_REQUESTS,
    RATE_LIMIT_TOKENS,
    RATE_LIMIT_STORE,
    POOL_QUEUE_FULL,
    POOL_QUEUE_TIMEOUT,
)

# Why a request went to its lane's fallback pool: the event's ``fallback_reason`` and the
# ``reason`` label of the fallbacks counter.
FALLBACK_UNAVAILABLE: Final = "unavailable"  # no replica of the pool accepted a connection
FALLBACK_SERVER_ERROR: Final = "server_error"  # the pool answered 5xx or 429
FALLBACK_TIMEOUT: Final = "timeout"  # no response head within the lane's first_token_s
FALLBACK_REASONS: Final = (FALLBACK_UNAVAILABLE, FALLBACK_SERVER_ERROR, FALLBACK_TIMEOUT)

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

# Why a request missed its lane's SLO gate: the ``cause`` label of slo_misses and the event's
# ``miss_cause`` (the rule that names it is obs.attribution's).
CAUSE: Final = "cause"
MISS_CAUSES: Final = (
    "admission_queue",  # waited for a slot in the lane's admission queue
    "engine_queue",  # waited in the engine's own queue: the pool was saturated
    "prefills_ahead",  # waited in the engine's queue behind long prompts in flight
    "kv_pressure",  # the engine was short of KV cache (near full, or preempting)
    "engine_slow",  # the engine's own prefill or decode per token far slower than usual
    "long_prefill",  # a prompt much longer than the lane's good requests'
    "cache_miss",  # missed the prefix cache where the lane's good requests usually hit it
    "slow_client",  # the client read slowly: the relay waited on it
    "upstream_error",  # the pool refused, failed or timed out
    "other",  # none of the above: slower than usual with nothing on record to say why
)
