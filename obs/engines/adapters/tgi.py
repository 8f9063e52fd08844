"""Text Generation Inference: batch size and queue size only.

TGI exports no KV usage ratio (``tgi_batch_current_max_tokens`` is the batch's
token budget, not cache usage), no prefix-cache counters and no preemptions:
those stay absent.
"""

from __future__ import annotations

from obs import conventions as c
from obs.engines.adapters.base import ENGINE_VIEW_FIELDS, Adapter
from obs.engines.metrics import EngineState, Sums


def _read(s: Sums) -> EngineState:
    return EngineState(
        engine="tgi",
        kv_cache_usage=None,
        running=s.sum(c.TGI_BATCH_SIZE),
        waiting=s.sum(c.TGI_QUEUE_SIZE),
        prefix_queries=None,
        prefix_hits=None,
        preemptions=None,
    )


TGI = Adapter(
    name="tgi",
    prefix="tgi_",
    read=_read,
    wants=(
        c.TGI_BATCH_SIZE,
        c.TGI_QUEUE_SIZE,
    ),
    serve_flags="none (/metrics is always on); spans: --otlp-endpoint COLLECTOR:4317 "
    "(OTLP/gRPC only: an OpenTelemetry Collector forwards them to http://SIDECAR:8000/v1/traces)",
    events={
        "error_message": "the error body's first 200 bytes (no `error.message` object)",
        "engine_view": "joined when the pool traces to the sidecar through a collector "
        "(`engine_traces: true`): its handler span (`chat_completions`, `completions`)",
        "cached_tokens": "null: its usage has no cached-token count",
        "cache_hit": "null",
        **dict.fromkeys(ENGINE_VIEW_FIELDS, "null: TGI measures no prefill/decode split"),
        "engine_queue_ms": "`queue_time` of its handler span",
        "engine_inference_ms": "`inference_time` of its handler span (prefill + decode)",
    },
    tested="captures written from its source (tests/data)",
)
