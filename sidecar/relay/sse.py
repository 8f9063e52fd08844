"""Server-sent events from a vLLM pool: framing, classification and the usage rewrite.

vLLM writes ``data: {json}\\n\\n`` frames (no ``event:``/``id:`` lines) and ends
with ``data: [DONE]``; its Responses API (``/v1/responses``) writes ``event: TYPE`` before
each ``data:`` line and ends with ``response.completed`` instead, and its Anthropic Messages
API (``/v1/messages``) ends with ``message_stop`` (``obs.sidecar.relay.api_events``).
The relay forwards frames byte for byte; it only needs to know how many generated tokens
a frame carries (``obs.openai_api.choice_tokens``: every token frame, whatever its text),
its finish reason and the usage.

Per token, that costs no JSON parse: a token frame is recognised by a few
byte searches anchored on its ``"finish_reason":`` key (found from the end,
where vLLM writes it), and the content key just before it. JSON escapes every
quote inside a string, so a key pattern such as ``"content":"`` can never
match inside generated text. Everything else (the usage frame, error frames,
several choices in one frame, frames that list their tokens, spaced or unknown
shapes) takes the full orjson parse, which is also the reference the fast path
is tested against.

When the client did not ask for ``stream_options.include_usage`` the sidecar
asks for it anyway (it needs the token counts) and removes the usage frame
again. vLLM then also moves ``system_fingerprint`` from the last content frame
to the usage frame, so ``UsageStripper`` holds the frame that finished the
choice until the usage frame arrives and puts the fingerprint back where vLLM
would have written it: as the frame's last key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from obs.openai_api import choice_tokens, frame_data
from obs.sidecar.relay.api_events import api_event, is_api_event

SEP = b"\n\n"


class FrameSplitter:
    """Splits a byte stream into complete SSE frames (each ending in a blank line).

    The common read, one whole frame, is returned as it is (no copy); several
    frames are sliced once each.
    """

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        """Complete frames in ``data`` (separator included); keeps the remainder."""
        buf = self._buf + data if self._buf else data
        i = buf.find(SEP)
        if i < 0:
            self._buf = buf
            return []
        start = i + 2
        if start == len(buf):
            self._buf = b""
            return [buf]
        frames = [buf[:start]]
        while (i := buf.find(SEP, start)) >= 0:
            frames.append(buf[start : i + 2])
            start = i + 2
        self._buf = buf[start:]
        return frames

    @property
    def pending(self) -> bytes:
        return self._buf


@dataclass(slots=True)
class StreamState:
    """What the relay learned from the frames so far."""

    output_frames: int = 0  # frames that carried at least one token
    tokens: int = 0  # the tokens those frames carried
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    done: bool = False
    fingerprint: str | None = None
    malformed: int = 0
    response_id: str | None = None  # a Responses API stream's response (relay.stored)
    spaced: bool = False  # the pool spaces its JSON: the byte search is not tried again
    extra: dict[str, Any] = field(default_factory=dict)


def classify(frame: bytes, state: StreamState) -> tuple[int, bool]:
    """Update ``state`` from one frame; returns (tokens it carries, is_usage_frame)."""
    if not state.spaced and frame.startswith(b"data: {"):
        fast = _classify_fast(frame, state)
        if fast is not None:
            return fast
    return classify_parsed(frame, state)


# Keys whose non-empty string value means output (chat delta, completions choice).
_TEXT_KEYS = (b'"content":"', b'"text":"', b'"reasoning_content":"', b'"reasoning":"')
_FINISH = b'"finish_reason":'
_INDEX = b'{"index":'
_FP = b'"system_fingerprint":"'
# How vLLM ends a token frame: nothing after the choice (no usage, no fingerprint).
_PLAIN_END = b'"token_ids":null}]}\n\n'
_LISTED = (b'"logprobs":{', b'"token_ids":[')  # the frame lists its tokens: count them parsed
_EMPTY_CONTENT = b'"content":""'
_EMPTY_TEXT = b'"text":""'


def _classify_fast(frame: bytes, state: StreamState) -> tuple[int, bool] | None:
    """vLLM's one-choice frame without usage, by byte search; None: parse it instead."""
    i = frame.rfind(_FINISH)
    if i < 0:
        return None  # no choice (usage or error frame) or an unknown shape
    j = i + len(_FINISH)
    if frame.startswith(b"null", j):
        finish = None
    elif frame.startswith(b'"', j):
        k = frame.find(b'"', j + 1)
        if k < 0 or frame.find(b"\\", j + 1, k) >= 0:
            return None
        finish = frame[j + 1 : k].decode()
    else:  # spaced or unusual JSON: this pool's frames are parsed from now on
        state.spaced = True
        return None
    if frame.count(_INDEX, 0, i) != 1:
        return None  # several choices in one frame, or tool-call deltas (indexed too)
    if frame.find(_LISTED[0], 0, i) >= 0 or frame.find(_LISTED[1], j) >= 0:
        return None
    if not frame.endswith(_PLAIN_END):
        if frame.find(b'"usage":{', j) >= 0:
            return None  # usage on every frame (continuous_usage_stats)
        if (f := frame.find(_FP, j)) >= 0:
            f += len(_FP)
            end = frame.find(b'"', f)
            if end > f:
                state.fingerprint = frame[f:end].decode()
    if finish is not None and state.finish_reason is None:
        state.finish_reason = finish
    if finish is not None or _has_text(frame, i):
        state.output_frames += 1
        state.tokens += 1
        return 1, False
    if frame.find(b'"delta":{', 0, i) >= 0:  # chat: a token with no text yet, or the role
        token = frame.find(_EMPTY_CONTENT, 0, i) >= 0 and frame.find(b'"role":"', 0, i) < 0
    else:
        token = frame.find(_EMPTY_TEXT, 0, i) >= 0
    state.output_frames += token
    state.tokens += token
    return int(token), False


def _has_text(frame: bytes, i: int) -> bool:
    """The choice ending before ``i`` has non-empty text, reasoning or a function call."""
    for key in _TEXT_KEYS:
        k = frame.rfind(key, 0, i)
        if k >= 0 and frame[k + len(key)] != 0x22:  # a non-empty string
            return True
    return frame.find(b'"function_call":{"', 0, i) >= 0


def classify_parsed(frame: bytes, state: StreamState) -> tuple[int, bool]:
    """``classify`` by a full JSON parse: any frame shape (the fast path's reference)."""
    payload = frame_data(frame)
    if payload is None:
        return 0, False
    if payload.startswith(b"[DONE]") and payload.rstrip() == b"[DONE]":
        state.done = True
        return 0, False
    try:  # JSON allows the frame's trailing blank line as whitespace
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        try:  # whitespace JSON does not allow (a form feed, ...), as ``rstrip`` removes it
            obj = orjson.loads(payload.rstrip())
        except orjson.JSONDecodeError:
            state.malformed += 1
            return 0, False
    if type(obj) is not dict:
        state.malformed += 1
        return 0, False
    if "error" in obj:
        err = obj["error"]
        state.error = err if isinstance(err, dict) else {"message": str(err)}
        return 0, False
    kind = obj.get("type")
    if type(kind) is str and is_api_event(kind):  # the Responses or the Messages API
        return api_event(obj, kind, state), False
    # A pool may send any JSON: only the expected types count, the rest is relayed untouched.
    choices = obj.get("choices")
    usage = obj.get("usage")
    if usage and type(usage) is dict:
        state.usage = usage
    fp = obj.get("system_fingerprint")
    if fp and type(fp) is str:
        state.fingerprint = fp
    tokens, any_choice = 0, False
    for choice in choices if type(choices) is list else ():
        if type(choice) is not dict:
            continue
        any_choice = True
        fr = choice.get("finish_reason")
        if type(fr) is str and state.finish_reason is None:
            state.finish_reason = fr
        tokens += choice_tokens(choice)
    if not any_choice:
        return 0, type(usage) is dict
    if tokens:
        state.output_frames += 1
        state.tokens += tokens
    return tokens, False


def _finishes(frame: bytes) -> bool:
    return b'"finish_reason":"' in frame


def add_fingerprint(frame: bytes, fingerprint: str) -> bytes:
    """Append ``system_fingerprint`` as the last key of a frame's JSON object."""
    body = frame.rstrip()
    if not body.endswith(b"}") or b'"system_fingerprint"' in body:
        return frame
    return body[:-1] + b',"system_fingerprint":' + orjson.dumps(fingerprint) + b"}" + SEP


_TIMINGS = b',"timings":{'


def move_timings(frame: bytes, usage_frame: bytes) -> bytes:
    """llama.cpp's ``timings``, which it writes as the last key of the last frame it sends
    (the usage frame when asked for usage), appended to ``frame`` as llama.cpp would have
    sent it without usage. Unchanged when the usage frame has none or ``frame`` has its own."""
    i = usage_frame.rfind(_TIMINGS)
    body = frame.rstrip()
    if i < 0 or not body.endswith(b"}") or b'"timings":' in body:
        return frame
    end = usage_frame.rstrip().rfind(b"}")  # closes the frame's object; timings is before it
    return body[:-1] + usage_frame[i:end] + b"}" + SEP


class UsageStripper:
    """Removes the usage frame the sidecar asked for and restores the engine's framing
    (vLLM's ``system_fingerprint``, llama.cpp's ``timings``).

    ``process`` takes one frame and returns the frames to send now (possibly
    none, while a finishing frame waits for the usage frame that follows it).
    """

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: list[bytes] = []

    def process(self, frame: bytes, is_usage: bool, fingerprint: str | None) -> list[bytes]:
        if is_usage:
            held, self._held = self._held, []
            if held and fingerprint:
                held[-1] = add_fingerprint(held[-1], fingerprint)
            if held:
                held[-1] = move_timings(held[-1], frame)
            return held
        if _finishes(frame):
            self._held.append(frame)
            return []
        if self._held:
            held, self._held = self._held, []
            return [*held, frame]
        return [frame]

    def flush(self) -> list[bytes]:
        held, self._held = self._held, []
        return held
