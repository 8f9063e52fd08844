"""llama.cpp's ``llama-server``: slots processing/deferred and prompt-cache tokens.

It has no KV usage ratio and no preemption counter (a slot keeps its context),
so those stay absent. ``llamacpp:prompt_tokens_total`` counts prompt tokens
*processed*, cached ones excluded: the lookups are processed + cached.
"""

from __future__ import annotations

from obs import conventions as c
from obs.engines.adapters.base import ENGINE_VIEW_FIELDS, Adapter
from obs.engines.metrics import EngineState, Sums, plus


def _read(s: Sums) -> EngineState:
    cached = s.sum(c.LLAMACPP_CACHED_TOKENS)
    return EngineState(
        engine="llamacpp",
        kv_cache_usage=None,
        running=s.sum(c.LLAMACPP_PROCESSING),
        waiting=s.sum(c.LLAMACPP_DEFERRED),
        prefix_queries=plus(s.sum(c.LLAMACPP_PROMPT_TOKENS), cached),
        prefix_hits=cached,
        preemptions=None,
    )


LLAMACPP = Adapter(
    name="llamacpp",
    prefix="llamacpp:",
    read=_read,
    wants=(
        c.LLAMACPP_PROCESSING,
        c.LLAMACPP_DEFERRED,
        c.LLAMACPP_PROMPT_TOKENS,
        c.LLAMACPP_CACHED_TOKENS,
    ),
    serve_flags="--metrics (required: without it /metrics answers 501 and the sidecar "
    "counts the replica down); no spans",
    events={
        "error_message": "`error.message` of its error body",
        "engine_view": "always absent: llama-server exports no spans",
        "cached_tokens": "yes (`usage.prompt_tokens_details.cached_tokens`)",
        **dict.fromkeys(ENGINE_VIEW_FIELDS, "null"),
    },
    tested="a real `llama-server` (tiny GGUF model)",
)
