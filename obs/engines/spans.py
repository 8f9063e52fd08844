"""Each engine's request span: which span it is, and its timing as the engine view's numbers.

The engine join (``obs.sidecar.record.engine_join``) merges one span per request into the
event (``obs.engines.view``). Which span that is, and where its timing is, differ:

- **vLLM**: ``llm_request``, ``gen_ai.latency.*`` in seconds (queue, prefill,
  decode, inference, TTFT), ``gen_ai.request.id`` derived from our ``X-Request-Id``
  (checked).
- **SGLang** (``--enable-trace``): the request's root span, named ``"{role} Req
  {rid[:8]}"`` (role empty unless prefill/decode disaggregation), a child of the
  caller's ``traceparent``, with ``module`` ``sglang::…``. When the request finishes
  its tokenizer manager sets ``gen_ai.latency.time_to_first_token``, ``e2e``,
  ``time_in_model_prefill``, ``time_in_model_decode`` and
  ``time_in_model_inference`` (seconds, measured in its API-server process: prefill
  runs from the hand-off to the scheduler to the first token, so it includes the
  scheduler's queue). It sets no ``time_in_queue``: the queue stays absent, not 0.
  Its ``gen_ai.request.id`` is SGLang's own ``rid`` (a body field or a uuid), not
  ours, so it is not checked; the (trace id, parent span id) key alone, which the
  sidecar issued for this request only, matches it.
- **TGI** (``--otlp-endpoint``): the handler's span (``chat_completions``,
  ``completions``, ``generate``, ``generate_stream``), whose parent is set from
  ``traceparent``, with ``queue_time``, ``inference_time`` and ``total_time``
  recorded as Rust ``Duration`` debug strings (``"1.5ms"``). Queue and inference
  (prefill + decode) map; TGI measures no prefill/decode split and no TTFT.

llama.cpp's ``llama-server`` exports no spans at all.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from obs.engines.view import MAX_ENGINE_S, BadEngineSpan, engine_numbers

SPANLESS: Final = frozenset({"llamacpp"})  # engines that export no spans at all
VLLM_SPAN: Final = "llm_request"
TGI_SPANS: Final = frozenset({"chat_completions", "completions", "generate", "generate_stream"})
# SGLang's root span: "{role} Req {rid[:8]}", role "" for a unified server.
_SGLANG_SPAN = re.compile(r"[a-z]* Req \S{1,8}")
SGLANG_MODULE: Final = "sglang::"
# TGI's span field -> the engine view's latency name.
TGI_FIELDS: Final = {
    "queue_time": "time_in_queue",
    "inference_time": "time_in_model_inference",
    "total_time": "e2e",
}
# Rust's Duration Debug format: "1.000000001s", "1.5ms", "7µs", "100ns".
_RUST_DURATION = re.compile(r"(\d{1,20}(?:\.\d{1,20})?)(s|ms|µs|μs|ns)")
_UNIT_S: Final = {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "μs": 1e-6, "ns": 1e-9}


@dataclass(frozen=True, slots=True)
class EngineSpan:
    engine: str
    request_id: str | None
    """An id the engine derived from our ``X-Request-Id``, to check; None: none to check."""
    numbers: dict[str, float]
    """``gen_ai.latency.*`` seconds, checked (``obs.engines.view.engine_numbers``)."""


def engine_of(name: str, attrs: Mapping[str, Any]) -> str | None:
    """The engine whose request span this is, or None (another span of the trace).

    TGI's ``Infer::generate*`` spans share the handlers' names but are their
    children and carry no timing: a TGI span counts only with a timing field.
    """
    if name == VLLM_SPAN:
        return "vllm"
    if name in TGI_SPANS and any(field in attrs for field in TGI_FIELDS):
        return "tgi"
    if _SGLANG_SPAN.fullmatch(name) and str(attrs.get("module", "")).startswith(SGLANG_MODULE):
        return "sglang"
    return None


def rust_duration_s(text: str) -> float:
    """Seconds of a Rust ``Duration`` debug string; ``BadEngineSpan`` for anything else."""
    m = _RUST_DURATION.fullmatch(text)
    if m is None:
        raise BadEngineSpan(f"{text[:40]!r} is not a duration")
    seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    if not (math.isfinite(seconds) and 0 <= seconds <= MAX_ENGINE_S):
        raise BadEngineSpan(f"{text[:40]!r} is out of range")
    return seconds


def _tgi_numbers(attrs: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for field, latency in TGI_FIELDS.items():
        if field not in attrs:
            continue
        v = attrs[field]
        if not isinstance(v, str):
            raise BadEngineSpan(f"{field} is not a duration string")
        out[f"gen_ai.latency.{latency}"] = rust_duration_s(v)
    return out


def read_span(name: str, attrs: Mapping[str, Any]) -> EngineSpan | None:
    """The engine request span this is, or None (another span of the trace).

    Raises ``BadEngineSpan`` when it is an engine's span but its timing is unusable:
    a number that is not a plausible duration, or no timing at all.
    """
    engine = engine_of(name, attrs)
    if engine == "vllm":
        rid = attrs.get("gen_ai.request.id")
        span = EngineSpan(engine, rid if isinstance(rid, str) else None, engine_numbers(attrs))
    elif engine == "tgi":
        span = EngineSpan(engine, None, _tgi_numbers(attrs))
    elif engine == "sglang":
        span = EngineSpan(engine, None, engine_numbers(attrs))
    else:
        return None
    if not span.numbers:
        raise BadEngineSpan(f"the {span.engine} span carries no timing")
    return span


__all__ = ["EngineSpan", "engine_of", "read_span", "rust_duration_s"]
