"""What the relay reads from requests and responses: routes, JSON bodies, usage, errors.

Pure helpers of ``obs.sidecar.relay.relay``: no I/O, nothing on the per-chunk path.
"""

from __future__ import annotations

import json
from hashlib import blake2b
from typing import Any

import orjson

from obs import conventions as c
from obs.events import Event
from obs.openai_api import BadField, Reading, event_text, prefix_text, read_request
from obs.sidecar.outcomes import Refusal, Refused
from obs.sidecar.relay.api_events import message_finish, response_finish
from obs.sidecar.relay.sse import StreamState
from obs.sidecar.types import Scope

# Routes whose responses the relay understands (SSE / completion JSON).
GENERATE_ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "text_completion"}
# The Responses API and Anthropic's Messages API: relayed as they are; their usage and end
# read as a completion's are (``obs.sidecar.relay.api_events``).
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
# The routes whose streams have a last frame ([DONE], or the APIs' last events): one cut
# before it ends with an error frame. Another route's stream ends where its pool's ends.
ENDED_STREAMS = frozenset({*GENERATE_ROUTES, RESPONSES, MESSAGES})
# Other OpenAI-API routes vLLM serves: relayed as they are, with a basic event.
PASSTHROUGH_ROUTES = {
    "/v1/embeddings": "embeddings",
    RESPONSES: "responses",
    MESSAGES: "messages",
    "/v1/messages/count_tokens": "count_tokens",
    "/tokenize": "tokenize",
    "/detokenize": "detokenize",
    "/v1/score": "score",
    "/score": "score",
    "/v1/rerank": "rerank",
    "/rerank": "rerank",
    "/pooling": "pooling",
    "/classify": "classify",
    "/v1/audio/transcriptions": "transcription",
    "/v1/audio/translations": "translation",
    "/v1/chat/completions/batch": "chat_batch",  # several conversations in one request
    "/invocations": "invocations",  # SageMaker's: a chat, completion or embedding by its body
    "/generative_scoring": "generative_scoring",
    # Cohere's API, served for pooling models (rerank, embed) and at /cohere for chat.
    "/v2/rerank": "rerank",
    "/v2/embed": "embeddings",
    "/cohere/v2/chat": "chat",
}


# The routes that generate text: a request without an output cap may use the context left.
GENERATING = frozenset({*ENDED_STREAMS, "/v1/chat/completions/batch", "/cohere/v2/chat"})


# Headers a request may carry once: two would let the sidecar and a proxy in front
# of it read different values (one key checked, another forwarded).
SINGLE_HEADERS = frozenset({"authorization", "x-request-id", "traceparent"})


def request_headers(scope: Scope) -> dict[str, str]:
    """The request's headers by name (lower case, as ASGI and the server give them; a repeated
    one's values joined with ``, ``, as HTTP reads them: a repeated tenant header then names
    no one tenant, ``obs.sidecar.policy.auth``); 400 when a ``SINGLE_HEADERS`` one repeats."""
    raw = scope["headers"]
    out = {k.decode("latin-1"): v.decode("latin-1") for k, v in raw}
    if len(out) < len(raw):  # a name repeats: a single one must not
        joined: dict[str, list[str]] = {}
        for k, v in raw:
            name = k.decode("latin-1")
            if name in joined and name in SINGLE_HEADERS:
                raise Refused(Refusal(400, f"the request has more than one {name} header"))
            joined.setdefault(name, []).append(v.decode("latin-1"))
        out = {name: ", ".join(values) for name, values in joined.items()}
    return out


def upstream_headers(
    headers: dict[str, str], request_id: str, traceparent: str, key: str | None, pass_auth: bool
) -> dict[str, str]:
    """The headers the pool is sent: the client's content type and accept, the request and
    trace ids; the pool's own API ``key``, else the client's authorization when ``pass_auth``
    (the sidecar does not check keys itself)."""
    h = {
        "content-type": headers.get("content-type", "application/json"),
        "x-request-id": request_id,
        "traceparent": traceparent,
        "accept": headers.get("accept", "*/*"),
    }
    if key:
        h["authorization"] = f"Bearer {key}"
    elif "authorization" in headers and pass_auth:
        h["authorization"] = headers["authorization"]
    if "tracestate" in headers:
        h["tracestate"] = headers["tracestate"]
    return h


def read_fields(route: str, body: dict[str, Any] | None, model_chars: int) -> Reading:
    """The request's model (cut to ``model_chars``, valid UTF-8), stream flag and output cap
    as the engine reads them (``obs.openai_api.read_request``); on a generate route a value
    the engine would refuse is a 400 naming the field, elsewhere it reads as absent."""
    try:
        read = read_request(
            body or {}, chat=route == "/v1/chat/completions", strict=route in GENERATE_ROUTES
        )
    except BadField as err:
        raise Refused(Refusal(400, f"invalid request field {err}")) from err
    mt, name = read.max_tokens, "max_tokens"
    if route == RESPONSES and body and "max_output_tokens" in body:  # the Responses API's cap
        mt, name = output_cap(body["max_output_tokens"]), "max_output_tokens"
    if mt is not None and mt < 1:  # vLLM refuses it too: never charged as a negative cost
        why = f"invalid request field {name}: must be at least 1, got {mt}"
        raise Refused(Refusal(400, why))
    # an event holds 32 bits: any cap past them exceeds every model's length
    mt = mt if mt is None else min(MAX_TOKENS_CAP, mt)
    return Reading(event_text(read.model, model_chars), read.stream, mt)


def output_cap(value: object) -> int | None:
    """An output cap read with pydantic's lax rules, as ``max_tokens`` is (None: not one)."""
    return read_request({"max_tokens": value}, chat=False, strict=False).max_tokens


def charged_output(route: str, max_tokens: int | None) -> int | None:
    """The output cap a rate limit charges: the request's; None when a generating route has
    none (charged as the context left: ``obs.sidecar.policy.rate_limit.output_estimate``);
    0 on a route that generates nothing."""
    if max_tokens is None and route not in GENERATING:
        return 0
    return max_tokens


def fingerprint(body: dict[str, Any]) -> str | None:
    """A short hash of the prompt's first 512 characters of text (multimodal parts by their
    text); None for a request with no messages or string prompt."""
    text = prefix_text(body)
    if text is None:
        return None
    return blake2b(text[:512].encode("utf-8", "replace"), digest_size=8).hexdigest()


def wants_usage(body: dict[str, Any]) -> bool:
    """The client asked for the usage frame (``stream_options.include_usage``)."""
    opts = body.get("stream_options")
    return isinstance(opts, dict) and bool(opts.get("include_usage"))


def usage_options(body: dict[str, Any]) -> dict[str, Any]:
    """``stream_options`` that make the pool send usage once, at the end.

    ``continuous_usage_stats`` only takes effect with ``include_usage``: a client that set it
    without usage receives no usage anywhere, so the sidecar turns it off when it asks.
    """
    opts = body.get("stream_options")
    base = opts if isinstance(opts, dict) else {}
    return {**base, "include_usage": True, "continuous_usage_stats": False}


def single_choice(body: dict[str, Any]) -> bool:
    """The stream has one choice: ``n`` (or ``best_of``) 1, one completions prompt.

    Only then can the sidecar ask for usage unseen: vLLM moves ``system_fingerprint`` from
    every choice's last frame to the usage frame, and with several choices the first
    choice's last frame leaves before the usage frame exists.
    """
    for key in ("n", "best_of"):
        v = body.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 1:
            return False
    prompt = body.get("prompt")
    return not (isinstance(prompt, list) and len(prompt) > 1 and not _is_token_ids(prompt))


def _is_token_ids(prompt: list[Any]) -> bool:
    return all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)


MAX_TOKENS_CAP = (1 << 31) - 1
# A run of 19 ASCII digits, found as a run of 19 zeros in the body with every digit made a zero
# and every other byte a space: ``bytes.translate`` and a substring search are about ten times
# faster than the regex ``\d{19}`` was (4.3 us for a 0.7 KB chat body, 12.7 us for 1.8 KB;
# linear in the body, so a long prompt paid it per kilobyte).
_DIGITS_AS_ZEROS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_RUN = b"0" * 19


class PythonJson(dict[str, Any]):
    """A body only Python's ``json`` reads (NaN, Infinity, 1e400, a lone surrogate, a BOM,
    UTF-16): written back with ``json.dumps``, so the engine reads what the client sent."""


def try_json(raw: bytes) -> dict[str, Any] | None:
    """The body as the engine reads it (vLLM: Starlette's ``json.loads`` of the bytes), or
    None when it is not a JSON object. orjson first (fast); what it refuses, Python's
    ``json`` may still accept, and then so does the engine. orjson also reads an integer
    past 64 bits as a float: a body with 19 digits in a row is read by ``json`` too."""
    try:
        body = orjson.loads(raw)
        if _LONG_RUN in raw.translate(_DIGITS_AS_ZEROS):
            raise orjson.JSONDecodeError("a long integer", "", 0)
    except orjson.JSONDecodeError:
        try:
            loose = json.loads(raw)
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            return None
        return PythonJson(loose) if isinstance(loose, dict) else None
    return body if isinstance(body, dict) else None


def dump_body(body: dict[str, Any]) -> bytes:
    """The body as JSON the engine reads back to the same values (see ``PythonJson``)."""
    if isinstance(body, PythonJson):
        return json.dumps(body, allow_nan=True).encode()
    return orjson.dumps(body)


def error_message(data: bytes) -> str:
    try:
        obj = orjson.loads(data)
        return str(obj["error"]["message"])[:300]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return data[:200].decode("utf-8", "replace")


def apply_usage_dict(ev: Event, usage: dict[str, Any] | None) -> None:
    """The token counts of a usage object: a completion's (``prompt_tokens``, ...), the
    Responses API's (``input_tokens``, ``output_tokens``, ``input_tokens_details``) or the
    Messages API's (``input_tokens``, ``output_tokens``, ``cache_read_input_tokens``)."""
    if not isinstance(usage, dict):
        return
    responses = "prompt_tokens" not in usage and "input_tokens" in usage
    prompt, completion, details_key = _RESPONSES_USAGE if responses else _COMPLETION_USAGE
    ev.prompt_tokens = _count(usage.get(prompt))
    ev.completion_tokens = _count(usage.get(completion))
    details = usage.get(details_key)
    if isinstance(details, dict):
        ev.cached_tokens = _count(details.get("cached_tokens"))
    elif "cache_read_input_tokens" in usage:  # the Messages API's
        ev.cached_tokens = _count(usage["cache_read_input_tokens"])


_COMPLETION_USAGE = ("prompt_tokens", "completion_tokens", "prompt_tokens_details")
_RESPONSES_USAGE = ("input_tokens", "output_tokens", "input_tokens_details")


def _count(v: object) -> int | None:
    """A token count as the pool reported it, or None when it is not a count at all."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def apply_usage(ev: Event, state: StreamState) -> None:
    """Token counts and finish reason of a stream, from its usage frame or its token frames.

    Without a usage frame (the client left, the pool failed, a multi-choice stream the
    sidecar did not ask usage for), the output tokens are counted from the token frames
    relayed (``obs.openai_api.choice_tokens``): vLLM sends one frame per generated token,
    whatever its text, and a frame that carries several lists them only when the client
    asked (``token_ids``, ``logprobs``), so the count is exact or a lower bound, and
    ``tokens_source`` says it was counted.
    """
    apply_usage_dict(ev, state.usage)
    if ev.completion_tokens is not None:
        ev.tokens_source = c.TOKENS_FROM_USAGE
    elif state.tokens:
        ev.completion_tokens = state.tokens
        ev.tokens_source = c.TOKENS_COUNTED
    ev.output_chunks = state.output_frames
    ev.finish_reason = state.finish_reason


def read_completion(ev: Event, data: bytes) -> str | None:
    """A whole answer's token counts and finish reason (a completion's, a response's or a
    message's); returns a response's id (where it is stored: ``obs.sidecar.relay.stored``)."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    apply_usage_dict(ev, obj.get("usage"))
    if ev.completion_tokens is not None:
        ev.tokens_source = c.TOKENS_FROM_USAGE
    if obj.get("object") == "response":  # the Responses API's answer
        ev.finish_reason = response_finish(obj)
        rid = obj.get("id")
        return rid if isinstance(rid, str) else None
    if obj.get("type") == "message":  # the Messages API's
        ev.finish_reason = message_finish(obj)
        return None
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        fr = choices[0].get("finish_reason")
        ev.finish_reason = fr if isinstance(fr, str) else None
    return None
