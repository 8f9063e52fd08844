"""What the client measures while one request runs. Pure: timestamps come in as ns.

The driver feeds a :class:`Measurement` the response's chunks with the
``time.perf_counter_ns`` at which it read each one; :meth:`Measurement.fields`
turns that into the record's latency and token fields.
"""

from __future__ import annotations

from typing import Any

from obs.loadgen.sse import Chunk
from obs.phases import ms, percentile


class Measurement:
    """Accumulates one request's chunks; ``start_ns`` is just before the request was sent."""

    def __init__(self, start_ns: int) -> None:
        self.start_ns = start_ns
        self.end_ns = start_ns
        self.first_ns = 0
        self.last_ns = 0
        self.gaps_ns: list[int] = []
        self.output_chunks = 0
        self.tokens = 0
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.bytes_received = 0
        self.error: str | None = None

    def chunk(self, chunk: Chunk, t_ns: int) -> None:
        """A streamed chunk read at ``t_ns``."""
        if chunk.usage is not None:
            self.usage = chunk.usage
        if chunk.error is not None and self.error is None:
            self.error = f"stream error: {chunk.error}"
        if chunk.finish_reason is not None and self.finish_reason is None:
            self.finish_reason = chunk.finish_reason
        if not chunk.output:
            return
        if self.first_ns == 0:
            self.first_ns = t_ns
        else:
            self.gaps_ns.append(t_ns - self.last_ns)
        self.last_ns = t_ns
        self.output_chunks += 1
        self.tokens += chunk.tokens

    def body(self, obj: dict[str, Any]) -> None:
        """A non-streamed response body."""
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = obj.get("choices") or []
        if choices and isinstance(choices[0], dict):
            reason = choices[0].get("finish_reason")
            self.finish_reason = reason if isinstance(reason, str) else None

    def fields(self) -> dict[str, Any]:
        """The record fields this measurement determines."""
        gaps = sorted(self.gaps_ns)
        streamed = self.first_ns > 0
        tokens, source = self._tokens()
        tpot = None
        if streamed and tokens is not None and tokens > 1:
            tpot = round(ms(self.last_ns - self.first_ns) / (tokens - 1), 3)
        details = (self.usage or {}).get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return {
            "ttft_ms": ms(self.first_ns - self.start_ns) if streamed else None,
            "itl_p50_ms": ms(percentile(gaps, 0.5)) if gaps else None,
            "itl_p95_ms": ms(percentile(gaps, 0.95)) if gaps else None,
            "itl_max_ms": ms(gaps[-1]) if gaps else None,
            "tpot_ms": tpot,
            "e2e_ms": ms(self.end_ns - self.start_ns),
            "completion_tokens": tokens,
            "tokens_source": source,
            "prompt_tokens": _int((self.usage or {}).get("prompt_tokens")),
            "cached_tokens": _int(cached),
            "output_chunks": self.output_chunks,
            "finish_reason": self.finish_reason,
            "bytes_received": self.bytes_received,
        }

    def _tokens(self) -> tuple[int | None, str | None]:
        used = _int((self.usage or {}).get("completion_tokens"))
        if used is not None:
            return used, "usage"
        if self.first_ns:
            return self.tokens, "chunks"
        return None, None


def _int(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None
