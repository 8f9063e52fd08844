"""The engine's view of a request, from its engine's request span, merged into the record.

The span's numbers arrive as ``gen_ai.latency.*`` seconds whatever the engine
(``obs.engines.spans`` maps SGLang's and TGI's). The engine measures from the
moment the request reached it: time in its waiting queue, model prefill, model
decode, TTFT (each where the engine reports it). The sidecar only sees the
outside. Merging moves the phase boundaries, never the total:

- the engine's queue time moves from ``prefill`` into ``queue`` (the request
  was waiting, not prefilling);
- for a non-streamed answer (which arrives whole), the engine's decode time
  moves from ``prefill`` into ``decode``, and the first token is placed where
  decode began, which gives the event a TTFT and a TPOT.

Every adjustment is clamped to the phase it takes time from, so phases stay
non-negative and still sum to ``e2e_ms``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from obs import conventions as c
from obs.phases import ms
from obs.record import Finished, fill_timings

NS = 1_000_000_000
# The span's numbers the join reads. Each must be a finite number of seconds in
# [0, MAX_ENGINE_S]: anything else rejects the whole span (its sender cannot be trusted).
LATENCIES = (
    "time_in_queue", "time_in_model_prefill", "time_in_model_decode",
    "time_in_model_inference", "time_to_first_token", "e2e",
)  # fmt: skip
MAX_ENGINE_S = 86_400.0


class BadEngineSpan(ValueError):
    """An ``llm_request`` span whose numbers are not durations the join can use."""


def engine_numbers(attrs: Mapping[str, Any]) -> dict[str, float]:
    """The span's latency attributes, checked: finite, non-negative, at most a day.

    Only these keys (``gen_ai.latency.*``) are kept, so what the join holds per span
    is a few floats whatever the sender attached. Raises ``BadEngineSpan`` otherwise.
    """
    out: dict[str, float] = {}
    for name in LATENCIES:
        key = f"gen_ai.latency.{name}"
        if key not in attrs:
            continue
        v = attrs[key]
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise BadEngineSpan(f"{key} is not a number")
        try:
            f = float(v)
        except OverflowError:
            raise BadEngineSpan(f"{key} is out of range") from None
        if not (math.isfinite(f) and 0 <= f <= MAX_ENGINE_S):
            raise BadEngineSpan(f"{key} is out of range")
        out[key] = f
    return out


def engine_request_ids(request_id: str) -> tuple[str, ...]:
    """The ids vLLM derives from our ``X-Request-Id`` (chat and completions)."""
    return (f"chatcmpl-{request_id}", f"cmpl-{request_id}-0", f"cmpl-{request_id}", request_id)


def _s(attrs: Mapping[str, Any], key: str) -> float | None:
    v = attrs.get(f"gen_ai.latency.{key}")
    return float(v) if isinstance(v, int | float) else None


def _tokens(attrs: Mapping[str, Any], key: str) -> int | None:
    v = attrs.get(f"gen_ai.usage.{key}")
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 31 else None


def apply_engine_view(f: Finished, attrs: Mapping[str, Any]) -> None:
    """Merge an ``llm_request`` span's attributes into ``f`` (clock, event, derived fields)."""
    ev, clock = f.event, f.clock
    queue = _s(attrs, "time_in_queue")  # SGLang's span has none: absent, not 0
    prefill = _s(attrs, "time_in_model_prefill")
    decode = _s(attrs, "time_in_model_decode")
    inference = _s(attrs, "time_in_model_inference")
    ttft = _s(attrs, "time_to_first_token")
    ev.engine_view = "joined"
    ev.engine_queue_ms = None if queue is None else ms(int(queue * NS))
    ev.engine_prefill_ms = None if prefill is None else ms(int(prefill * NS))
    ev.engine_decode_ms = None if decode is None else ms(int(decode * NS))
    ev.engine_inference_ms = None if inference is None else ms(int(inference * NS))
    ev.engine_ttft_ms = None if ttft is None else ms(int(ttft * NS))
    if ev.tokens_source != c.TOKENS_FROM_USAGE:  # no usage frame: the engine's counts are exact
        output = _tokens(attrs, "completion_tokens")
        if output is not None:
            ev.prompt_tokens, ev.completion_tokens = _tokens(attrs, "prompt_tokens"), output
            ev.tokens_source = c.TOKENS_FROM_ENGINE
    if not clock.dispatched:
        fill_timings(f)
        return
    prefill_end = clock.first_up or clock.end
    # The engine's queue wait is queueing, not prefill.
    moved = min(int((queue or 0.0) * NS), max(0, prefill_end - clock.dispatched))
    clock.dispatched += moved
    if not ev.stream and decode is not None and clock.first_up:
        # A whole answer: the first token was made where the engine's decode began.
        arrival = clock.first_up
        first = max(clock.dispatched, arrival - int(decode * NS))
        clock.first_up = clock.first_sent = first
        clock.last_up = arrival
    fill_timings(f)
