"""The request event: one JSON line per request the sidecar handled.

The schema is flat (one level) so that log tools, DuckDB and pandas read it
without unnesting. Durations are milliseconds, named ``*_ms``. Fields a
request never reached are ``null``. The first eight documented fields after
the ids are the minimal request-log record serving teams already chart
(``request_id``, ``model``, ``prompt_tokens``, ``completion_tokens``,
``ttft_ms``, ``tpot_ms``, ``cache_hit``, ``finish_reason``).

Bump ``SCHEMA_VERSION`` on any change that renames or retypes a field; adding
a field is compatible.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import orjson

SCHEMA_VERSION = 1


def _f(doc: str, default: Any = None) -> Any:
    return field(default=default, metadata={"doc": doc})


# Not slots: orjson writes a dataclass's ``__dict__`` in one pass (0.8 µs), where a slotted one
# is read field by field through its ``__dataclass_fields__`` (2.8 µs a short request's line).
@dataclass
class Event:
    """One request as the sidecar saw it. ``to_json`` gives the JSONL line."""

    schema_version: int = _f("Event schema version (this document: 1).", SCHEMA_VERSION)
    ts: str = _f("Wall-clock time the request was received, ISO 8601 UTC, ms precision.", "")
    request_id: str = _f(
        "Request id: the client's `X-Request-Id` (at most 128 characters), or one the sidecar "
        "made.",
        "",
    )
    trace_id: str | None = _f("W3C trace id (32 hex) of the request's trace.")
    span_id: str | None = _f("Span id of the sidecar's root span.")
    model: str | None = _f(
        "Model the client asked for (at most 256 characters), or the one its pool serves when "
        "it named none (as the engine does)."
    )
    prompt_tokens: int | None = _f(
        "Prompt tokens, from the pool's usage (once per request, also for n > 1); null when "
        "the pool sent no usage (a cancelled stream, a multi-choice stream)."
    )
    completion_tokens: int | None = _f(
        "Output tokens (all choices): from the pool's usage, or, when it sent none, counted "
        "from the token chunks relayed, whatever their text (vLLM sends a chunk per token; "
        "one that carries several counts as many as it lists in token_ids or logprobs, else "
        "as one: then a lower bound); see `tokens_source`."
    )
    ttft_ms: float | None = _f(
        "Time to first token: received to the engine's first token chunk handed to the "
        "client, whatever its text (= queue + prefill + first_token). Null for non-streamed "
        "requests and for error replies (an error body is not a first token)."
    )
    tpot_ms: float | None = _f(
        "Time per output token after the first, as produced by the pool. With the engine's "
        "span joined (engine_view `joined`), the engine's own clock: engine_decode_ms / "
        "(completion_tokens - 1). Otherwise the sidecar's: (last output chunk's arrival - "
        "first's) / (completion_tokens - chunks that came with the first); null when more "
        "than half the tokens came with the first read (a burst: the cadence was not seen)."
    )
    cache_hit: bool | None = _f("True when any prompt token came from the prefix cache.")
    finish_reason: str | None = _f("Finish reason of the (first) choice: stop, length, ...")
    lane: str = _f("Lane the request was classified into.", "default")
    class_source: str | None = _f(
        "What put the request in its lane: header (a header rule, e.g. `X-Client-Class`), rule "
        "(a rule over the request itself: tools, where its context sits, size, prefix seen, "
        "stream, `n`, response format), learned (the client was learned to read slowly) or "
        "default (no rule matched)."
    )
    pool: str = _f("Pool the lane routes to.", "default")
    replica: str | None = _f("Base URL of the pool replica that served the request.")
    arm: str | None = _f(
        "The arm of the lane's split the client's identity chose (a pool name; the pool "
        "before any fallback); null when the lane has no split."
    )
    identity: str | None = _f(
        "A keyed hash (16 hex) of the client identity that chose the split arm (the lane's "
        "canary.sticky: API key, tenant or address), never the identity itself; `query "
        "canary` caps one identity's weight by it. Null when the lane has no split."
    )
    fallback_from: str | None = _f(
        "The pool that refused, failed or timed out before the first byte when the lane's "
        "fallback pool (`pool`) answered instead; null when no fallback happened."
    )
    fallback_reason: str | None = _f(
        "Why the request fell back: unavailable (no replica accepted a connection), "
        "server_error (the pool answered 5xx or 429) or timeout (no response within the "
        "lane's first_token_s)."
    )
    priority: int | None = _f(
        "The request's priority in its lane (0-9, higher admitted first), when the lane has a "
        "priority policy: from the header, the tenant's setting, a rule, or the default."
    )
    tenant: str | None = _f(
        "Tenant, when the lane config maps keys or a header to tenants (a header's value: at "
        "most 64 characters)."
    )
    route: str = _f("Request path, e.g. /v1/chat/completions.", "")
    stream: bool = _f("Whether the client asked for a streamed response.", False)
    status: str = _f(
        "Outcome: ok, error (server-side failure), client_error (a 4xx: the request was bad), "
        "rejected (admission, or the sidecar's connection limits shedding load: 503), "
        "client_disconnect.",
        "ok",
    )
    http_status: int | None = _f("HTTP status the client received (or would have).")
    error_class: str | None = _f(
        "Why it failed: upstream_connect, upstream_status, upstream_timeout, deadline (a "
        "non-streamed answer not whole within the lane's first_token_s), "
        "upstream_protocol, upstream_stream_error, oom (a 5xx status or error frame whose text "
        "says the engine ran out of memory), client_disconnect, slow_client, admission, "
        "bad_request, unauthorized, request_limit (the sidecar's server refused it: headers "
        "too many or too large, 431, or too slow, 408; a body too slow, 408, or past the body "
        "memory budget, 503; an Upgrade, 400), shutdown, internal."
    )
    error_phase: str | None = _f("Phase the request was in when it failed.")
    error_message: str | None = _f(
        "Short error text, at most 300 characters (never prompt or output text)."
    )
    rejection_reason: str | None = _f(
        "Why the request was refused: an admission reason when status is rejected "
        "(queue_full, queue_timeout, tenant_share, prompt_too_long, over_token_budget, "
        "lower_priority, rate_limit_requests, rate_limit_tokens, rate_limit_store, "
        "pool_queue_full, pool_queue_timeout, engine_queue_full), or pool_unavailable with "
        "status error."
    )
    admission_gate: str | None = _f(
        "Which gate held (queued) or refused the request, when one did: lane (its lane's "
        "limits), pool:waiting, pool:kv_cache, pool:stale or pool:no_replica (its pool's "
        "saturation, by the bound that held it), or rate_limit (its tenant's or key's rate "
        "limit); null when it was admitted at once."
    )
    miss_slo: str | None = _f(
        "The gates of its lane's SLO the request missed, comma-separated in ttft, tpot, "
        "availability order (e.g. `ttft` or `ttft,tpot`); null for a request that missed none "
        "(a good one, a refused one, one of a lane without SLOs)."
    )
    miss_phase: str | None = _f(
        "The phase the first missed gate is charged to: the one that took the most over what "
        "the lane's good requests take in it (a failure: the phase it failed in). See "
        "docs/query.md, Where the error budget went."
    )
    miss_cause: str | None = _f(
        "Why the first missed gate was missed: admission_queue, engine_queue, prefills_ahead, "
        "kv_pressure, engine_slow, long_prefill, cache_miss, slow_client, upstream_error or "
        "other (the rule: docs/query.md, Where the error budget went); null when miss_slo is."
    )
    cached_tokens: int | None = _f(
        "Prompt tokens served from the prefix cache (needs vLLM's "
        "`--enable-prompt-tokens-details`; null without it)."
    )
    max_tokens: int | None = _f("max_tokens (or max_completion_tokens) the client asked for.")
    e2e_ms: float = _f(
        "End-to-end, the server's side: the request's body complete to the last byte "
        "acknowledged by the client's side (docs/record.md). The upload before it is "
        "upload_ms.",
        0.0,
    )
    upload_ms: float | None = _f(
        "The client's upload: the request's first byte read to its body complete. The "
        "client's time, in no phase, in neither e2e_ms nor ttft_ms; 0 when the whole request "
        "came in one read; null where the server does not say (another ASGI server)."
    )
    queue_ms: float = _f("Phase: body complete to dispatched to the pool.", 0.0)
    prefill_ms: float = _f("Phase: dispatched to first upstream chunk carrying a token.", 0.0)
    first_token_ms: float = _f(
        "Phase: that chunk's arrival to its bytes handed to the client.", 0.0
    )
    decode_ms: float = _f("Phase: first token handed to the client to last upstream output.", 0.0)
    stream_ms: float = _f(
        "Phase: last upstream output to the last byte acknowledged by the client's side "
        "(a stream; any connection kind), or handed to it (a whole body). With "
        "client_unread_bytes set, the time until the sidecar stopped waiting: a lower bound.",
        0.0,
    )
    client_unread_bytes: int | None = _f(
        "Bytes of the stream the client's side had not acknowledged when the sidecar stopped "
        "waiting for them (the lane's slow_client.record_wait_s) or when the client reset "
        "the connection: a slow reader whose stream_ms is a lower bound. Null when it "
        "acknowledged every byte, or for a whole body."
    )
    stream_blocked_ms: float = _f("Time the relay spent blocked writing to the client.", 0.0)
    output_chunks: int = _f("Upstream chunks that carried at least one generated token.", 0)
    burst_chunks: int | None = _f(
        "The most output chunks that arrived in one read from the pool (1: each arrived on "
        "its own). Chunks of one read give no inter-token gap; a stream whose output all "
        "came in one read has no TPOT or ITL and stays out of those histograms."
    )
    tokens_source: str | None = _f(
        "Where the token counts come from: usage (the pool's usage, exact), engine (no usage, "
        "but the engine's joined span reported them, exact) or counted (neither: "
        "completion_tokens counted from token chunks, a lower bound; prompt_tokens null)."
    )
    itl_p50_ms: float | None = _f(
        "Median gap between reads that brought output, as they arrived upstream."
    )
    itl_p95_ms: float | None = _f("95th percentile of those gaps.")
    itl_max_ms: float | None = _f("Largest of those gaps.")
    usage_injected: bool = _f(
        "True when the sidecar asked the pool for usage the client did not request "
        "(and removed it from the client's stream).",
        False,
    )
    engine_view: str = _f(
        "Where the engine's side of the request comes from: joined (the engine's request span "
        "was joined: vLLM, SGLang, TGI), inferred (no span, but the pool's state at dispatch "
        "says the request waited for a batch slot: the wait is estimated from the sidecar's "
        "own timings, see `engine_queue_ms`), or absent (no span and no sign of a wait: pool "
        "not tracing to the sidecar, request failed, the span came after the join wait or had "
        "no usable timing; llama.cpp sends none).",
        "absent",
    )
    engine_queue_ms: float | None = _f(
        "Engine: time in the engine's waiting queue (the span's; with engine_view `inferred`, "
        "an estimate: the prefill beyond the lane's good requests' mean prefill, moved from "
        "prefill_ms into queue_ms)."
    )
    engine_prefill_ms: float | None = _f("Engine: time in model prefill.")
    engine_decode_ms: float | None = _f("Engine: time in model decode.")
    engine_inference_ms: float | None = _f("Engine: prefill + decode.")
    engine_ttft_ms: float | None = _f("Engine: arrival in the engine to first token.")
    pool_in_flight: int | None = _f(
        "Requests the sidecar had in flight on the serving replica when it dispatched this one "
        "(this one not counted); null when the request reached no replica."
    )
    pool_max_running: int | None = _f(
        "The serving replica's batch slots at dispatch: the pool's declared max_num_seqs, "
        "else what its engine reports (llama.cpp's slots); null when unknown."
    )
    pool_waiting: int | None = _f(
        "Requests waiting in the serving replica's engine queue at the sidecar's last poll "
        "before dispatch; null when the engine reports none or was not read yet."
    )
    pool_kv_usage: float | None = _f(
        "The serving replica's KV-cache usage (0-1) at the sidecar's last poll before dispatch."
    )
    pool_preempting: bool | None = _f(
        "True when the serving replica's engine preempted requests between the sidecar's last "
        "two polls before dispatch (KV cache short)."
    )
    pool_ahead_prompt_tokens: int | None = _f(
        "Estimated prompt tokens (request bytes / 4) of the requests in flight on the serving "
        "replica at dispatch: the prefills ahead of this one."
    )
    pool_prompt_tokens_during: int | None = _f(
        "Estimated prompt tokens (request bytes / 4) sent to the serving replica while this "
        "request was in flight there: the other requests' prefills that shared its steps."
    )
    pool_requests_during: int | None = _f(
        "Requests sent to the serving replica while this request was in flight there (this one "
        "not counted): with `pool_prompt_tokens_during`, how many prefills shared its steps."
    )
    pool_others_prompt_share: float | None = _f(
        "Share (0-1) of the serving replica's in-flight prompt tokens not yet prefilled (request "
        "bytes / 4) that other lanes' requests held from this request's dispatch to its first "
        "token (its end, without one), averaged over that time: how much of the prefill work "
        "ahead of and beside it was another lane's. Null when the replica held none, or the "
        "request reached no replica."
    )
    pool_others_running_share: float | None = _f(
        "Share (0-1) of the sequences decoding on the serving replica (the sidecar's requests "
        "with a first token) that other lanes held over the same time; null when none decoded."
    )
    prefix_fingerprint: str | None = _f(
        "Short hash of the prompt's first 512 characters, for cache analysis (no text)."
    )
    settings_fingerprint: str | None = _f(
        "Short hash of the engine, version and settings the serving replica reported when the "
        "request was sent (the `fingerprint` label of `vllm_obs_pool_settings_info`); null "
        "before the sidecar first read them."
    )
    config_fingerprint: str | None = _f(
        "Short hash of the sidecar's lanes config (the `config_hash` label of "
        "`vllm_obs_config_info`)."
    )
    summarized: int | None = _f(
        "Null for a request's own event. On a summary record (`request_id` `summary-...`): how "
        "many client-caused events of this lane and outcome (refusals, 4xx before a pool, "
        "disconnects before a pool) in the second from `ts` were counted but not written one "
        "by one (`--client-events-per-s`). Queries count a record as this many requests."
    )
    json_valid: bool | None = _f(
        "For a request that asked for JSON (response_format json_object or json_schema, or "
        "tools): whether its answer (its tool calls' arguments) parses as JSON, checked as it "
        "streamed; null for other requests and for a tools request answered without a call."
    )
    prompt_text: str | None = _f(
        "The prompt's text, redacted; only with --capture-text prompt|all (else null)."
    )
    output_text: str | None = _f(
        "The output's text (first choice), redacted; only with --capture-text output|all."
    )

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _NAMES}

    def to_json(self) -> bytes:
        """One JSONL line, newline included: ``to_dict``'s object, which orjson writes from
        the dataclass's ``__dict__`` (its fields in order: ``__init__`` sets each) without
        building it; an event given an attribute that is no field is written from ``to_dict``
        (its fields alone, in order)."""
        if len(self.__dict__) == _COUNT:
            return orjson.dumps(self, option=orjson.OPT_APPEND_NEWLINE)
        return orjson.dumps(self.to_dict(), option=orjson.OPT_APPEND_NEWLINE)


_NAMES = tuple(f.name for f in fields(Event))
_COUNT = len(_NAMES)


def field_docs() -> list[tuple[str, str, str]]:
    """(name, type, description) of every event field, in schema order."""
    return [(f.name, str(f.type), f.metadata["doc"]) for f in fields(Event)]
