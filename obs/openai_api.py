"""What an OpenAI-API request or streamed chunk says: its prompt text, whether it carries output.

Pure, one home for both sides of the wire: the lane classifier (prompt size), the
sidecar's text capture and prefix fingerprint (prompt text), the sidecar's stream
classifier and the load generator's chunk parser (output), so that the client's and
the sidecar's TTFT end at the same chunk.

Prompt text: a chat request's messages' ``content`` (a string, or a list of parts
of which only the ``text`` parts count: an image part has no text), or a
completion's ``prompt`` (a string or a list of strings; token ids have no text).

A choice *carries output* when it carries at least one generated token
(``choice_tokens``): the first such chunk ends TTFT on both sides. vLLM sends one
chunk per token, whatever the token's text: a token that decodes to no text yet (part
of a multi-byte character, a special token) comes as ``"content":""`` (chat) or
``"text":""`` (completions), and counts. The chat role chunk (``"role":"assistant"``
with empty content, one per choice, before any token) carries none. A chunk lists the
tokens it carries when the client asked for them (``token_ids`` with vLLM's
``return_token_ids``, ``logprobs``): several when vLLM merged outputs (its
``--stream-interval``, or its API server falling behind the engine). Without a list a
token chunk counts as one, so a count from chunks is exact or a lower bound.

A choice *has text* when its delta has non-empty ``content``, ``reasoning_content``
(vLLM's reasoning parsers), ``reasoning``, ``tool_calls`` or ``function_call``, or
(completions) non-empty ``text``: the first visible output, not the first token.

An error inside a stream (``{"error": {..., "code": 400}}``) is the client's when its
code is a 4xx and the pool's otherwise (``error_code``).

Fields (``read_request``): the model, the stream flag and the output-token cap, read
with the engine's own rules (pydantic's lax coercion, vLLM's precedence), so that the
sidecar classifies and admits a request as the engine will serve it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from pydantic import TypeAdapter, ValidationError

from obs.numerals import whole_number

T = TypeVar("T")

# Delta keys whose non-empty value is generated output (about one token each).
OUTPUT_DELTA_KEYS = ("content", "reasoning_content", "reasoning", "tool_calls", "function_call")


def content_texts(content: Any) -> Iterator[str]:
    """The text of one message's ``content``: the string, or each ``text`` part's text."""
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):  # [{"type": "text", "text": ...}, {"type": "image_url"...}]
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                yield part["text"]


def sse_data(frame: bytes) -> bytes | None:
    """The data of a frame that has other fields too (``event:``, ``id:``, comments): its
    ``data`` lines joined by newlines, as an EventSource reads them; None without any."""
    lines = [ln.rstrip(b"\r") for ln in frame.split(b"\n")]
    data = [ln[5:].removeprefix(b" ") for ln in lines if ln.startswith(b"data:")]
    return b"\n".join(data) if data else None


def frame_data(frame: bytes) -> bytes | None:
    """An SSE frame's data: after ``data: `` in the common frame (one data line, trailing
    blank line kept: JSON reads it as whitespace), else ``sse_data``'s."""
    return frame[6:] if frame.startswith(b"data: ") else sse_data(frame)


def messages(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The chat messages that are objects; None when the body has no ``messages`` list."""
    msgs = body.get("messages")
    return [m for m in msgs if isinstance(m, dict)] if isinstance(msgs, list) else None


def prompt_strings(body: Mapping[str, Any]) -> list[str] | None:
    """A completion's prompt as strings (token ids left out); None when there is no prompt."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list):
        return [p for p in prompt if isinstance(p, str)]
    return None


def prompt_text(body: Mapping[str, Any]) -> str:
    """A chat request's messages as ``role: text`` lines (a Messages API request's ``system``
    first), a completion's prompt lines, or a Responses API request's ``instructions`` and
    ``input`` (a string, or its message items)."""
    if "input" in body and "messages" not in body and "prompt" not in body:
        return "\n".join(_response_input_lines(body))
    msgs = messages(body)
    if msgs is not None:
        lines = [f"system: {t}" for t in content_texts(body.get("system"))]  # Messages API
        for m in msgs:
            role = m.get("role") if isinstance(m.get("role"), str) else "?"
            lines += [f"{role}: {t}" for t in content_texts(m.get("content"))]
        return "\n".join(lines)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and not all(isinstance(p, str) for p in prompt):
        return ""  # token ids: no text
    return "\n".join(prompt_strings(body) or [])


def _response_input_lines(body: Mapping[str, Any]) -> Iterator[str]:
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        yield f"system: {instructions}"
    items = body.get("input")
    if isinstance(items, str):
        yield f"user: {items}"
        return
    for item in items if isinstance(items, list) else ():
        if isinstance(item, dict) and "content" in item:  # a message (function calls: no text)
            role = item.get("role") if isinstance(item.get("role"), str) else "?"
            yield from (f"{role}: {t}" for t in content_texts(item["content"]))


def prefix_text(body: Mapping[str, Any]) -> str | None:
    """The text a prompt starts with, for a prefix fingerprint: the messages' text run
    together, or a string prompt; None when the request has neither."""
    msgs = body.get("messages")
    if isinstance(msgs, list) and msgs and isinstance(msgs[0], dict):
        texts: list[str] = []
        for m in msgs:
            if isinstance(m, dict):
                content = m.get("content")
                if isinstance(content, str):  # (most messages: no generator to resume)
                    texts.append(content)
                else:
                    texts += content_texts(content)
        return "".join(texts)
    prompt = body.get("prompt")
    return prompt if isinstance(prompt, str) else None


def choice_carries_output(choice: Mapping[str, Any]) -> bool:
    """The choice carries at least one generated token (see the module docstring)."""
    return choice_tokens(choice) > 0


def choice_tokens(choice: Mapping[str, Any]) -> int:
    """How many generated tokens one streamed choice carries (see the module docstring)."""
    listed = _listed_tokens(choice)
    if listed:
        return listed
    if choice.get("finish_reason") is not None or choice_has_text(choice):
        return 1
    delta = choice.get("delta")
    if isinstance(delta, dict):  # a token with no text yet; the role chunk carries none
        return 1 if delta.get("content") == "" and not isinstance(delta.get("role"), str) else 0
    return 1 if choice.get("text") == "" else 0


def _listed_tokens(choice: Mapping[str, Any]) -> int:
    """The tokens a choice lists (``token_ids``, or its logprobs' entries); 0 if none."""
    ids = choice.get("token_ids")
    if isinstance(ids, list) and ids:
        return len(ids)
    lp = choice.get("logprobs")
    if isinstance(lp, dict):
        entries = lp.get("content", lp.get("tokens"))  # chat, completions
        if isinstance(entries, list):
            return len(entries)
    return 0


def error_code(error: Any) -> int | None:
    """The HTTP status an error object names (``code``, an int or digits), or None."""
    code = error.get("code") if isinstance(error, dict) else None
    if isinstance(code, str):
        code = whole_number(code)
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def choice_has_text(choice: Mapping[str, Any]) -> bool:
    """The choice carries generated text, reasoning or a tool call (not just a finish)."""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        for key in OUTPUT_DELTA_KEYS:  # noqa: SIM110  (per token: no generator)
            if delta.get(key):
                return True
        return False
    return bool(choice.get("text"))


# ---- reading a request's fields as the engine will -------------------------------------

# vLLM validates a request with pydantic in lax mode: "100000", 100000.0 and true are the
# integer 100000, 100000 and 1; 1, "yes" and "true" are the boolean true.
_INT: TypeAdapter[int | None] = TypeAdapter(int | None)
_BOOL: TypeAdapter[bool | None] = TypeAdapter(bool | None)
_STR: TypeAdapter[str | None] = TypeAdapter(str | None)
# The value of exactly this type is valid as it is (the common case, without pydantic's call).
_EXACT: dict[TypeAdapter[Any], type] = {_INT: int, _BOOL: bool, _STR: str}


class BadField(ValueError):
    """A request field the engine's validation refuses; ``field`` names it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


@dataclass(slots=True)  # not frozen: object.__setattr__ per field, two a request
class Reading:
    """What the engine reads from a request: its model, whether it streams, its output cap."""

    model: str | None = None
    stream: bool = False
    max_tokens: int | None = None


def read_request(body: Mapping[str, Any], *, chat: bool, strict: bool = True) -> Reading:
    """The request's model, stream flag and output-token cap, read as vLLM reads them.

    A chat request's cap is ``max_completion_tokens`` when set, else ``max_tokens`` (vLLM's
    precedence); a completion's is ``max_tokens``. A value the engine refuses raises
    :class:`BadField` (``strict``) or reads as absent.
    """
    max_tokens = _field(body, "max_tokens", _INT, strict)
    if chat:
        completion = _field(body, "max_completion_tokens", _INT, strict)
        if completion is not None:
            max_tokens = completion
    return Reading(
        model=_field(body, "model", _STR, strict),
        stream=_field(body, "stream", _BOOL, strict) is True,
        max_tokens=max_tokens,
    )


def _field(body: Mapping[str, Any], name: str, adapter: TypeAdapter[T], strict: bool) -> T | None:
    if name not in body:
        return None
    value = body[name]
    if value is None or type(value) is _EXACT[adapter]:  # what lax mode returns unchanged
        return cast(T, value)
    try:
        return adapter.validate_python(value)
    except ValidationError as err:
        if not strict:
            return None
        problem = err.errors()[0]["msg"] if err.errors() else "invalid value"
        raise BadField(name, problem) from None


def event_text(value: str | None, limit: int) -> str | None:
    """A client's string as an event holds it: at most ``limit`` characters, valid UTF-8
    (a lone surrogate, which Python's JSON reads, becomes ``?``)."""
    if value is None:
        return None
    return value[:limit].encode("utf-8", "replace").decode("utf-8")
