"""SGLang: KV usage, running/queued requests and prefix-cache tokens; no preemption counter.

``sglang:token_usage`` is the share of the KV pool's tokens in use (0-1).
``sglang:prompt_tokens_total`` counts every prompt token, cached ones included,
so it is the lookup count and ``sglang:cached_tokens_total`` the hit count.
``sglang:num_retracted_reqs`` is a gauge of the last batch's retractions, not a
counter, so preemptions stay absent rather than being guessed from it.
"""

from __future__ import annotations

from obs import conventions as c
from obs.engines.adapters.base import ENGINE_VIEW_FIELDS, Adapter
from obs.engines.metrics import EngineState, Sums


def _read(s: Sums) -> EngineState:
    queries = s.sum(c.SGLANG_PROMPT_TOKENS)
    hits = s.sum(c.SGLANG_CACHED_TOKENS)
    if hits is None and queries is not None:
        hits = 0.0  # SGLang creates the cached-token child on its first cache hit
    return EngineState(
        engine="sglang",
        kv_cache_usage=s.mean(c.SGLANG_TOKEN_USAGE),
        running=s.sum(c.SGLANG_RUNNING),
        waiting=s.sum(c.SGLANG_WAITING),
        prefix_queries=queries,
        prefix_hits=hits,
        preemptions=None,
    )


SGLANG = Adapter(
    name="sglang",
    prefix="sglang:",
    read=_read,
    wants=(
        c.SGLANG_TOKEN_USAGE,
        c.SGLANG_RUNNING,
        c.SGLANG_WAITING,
        c.SGLANG_PROMPT_TOKENS,
        c.SGLANG_CACHED_TOKENS,
    ),
    serve_flags="--enable-metrics; spans: --enable-trace --otlp-traces-endpoint "
    "http://SIDECAR:8000/v1/traces with OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf",
    events={
        "error_message": "the error body's first 200 bytes (no `error.message` object)",
        "engine_view": "joined when the pool traces to the sidecar (`engine_traces: true`): "
        "its root request span",
        "cached_tokens": "with `--enable-cache-report`",
        "cache_hit": "with `--enable-cache-report`",
        **dict.fromkeys(ENGINE_VIEW_FIELDS, "with `--enable-trace` (its root request span)"),
        "engine_queue_ms": "null: its span has no queue time (the queue is inside "
        "`engine_prefill_ms`)",
        "engine_prefill_ms": "with `--enable-trace`: from its hand-off to the scheduler to the "
        "first token (includes the scheduler's queue)",
    },
    tested="captures written from its source (tests/data)",
)
