"""SSE framing, classification and the usage rewrite, against vLLM's captured output."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from obs import conventions as c
from obs.openai_api import error_code
from obs.sidecar import outcomes as e
from obs.sidecar.relay.sse import (
    SEP,
    FrameSplitter,
    StreamState,
    UsageStripper,
    add_fingerprint,
    classify,
    classify_parsed,
)

CAPTURE = Path(__file__).resolve().parents[2] / "data" / "vllm-0.32-sse-capture.txt"


def _sections() -> dict[str, bytes]:
    text = CAPTURE.read_bytes()
    parts = re.split(rb"^### (.+)\n", text, flags=re.M)
    return {parts[i].decode(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def _normalise_ids(data: bytes) -> bytes:
    return re.sub(rb'"id":"[a-z]+-[0-9a-f]+"', b'"id":"X"', data)


def _strip(stream: bytes, chunk: int) -> tuple[bytes, StreamState]:
    splitter, state, stripper = FrameSplitter(), StreamState(), UsageStripper()
    out = []
    for i in range(0, len(stream), chunk):
        for frame in splitter.feed(stream[i : i + chunk]):
            _, is_usage = classify(frame, state)
            out += stripper.process(frame, is_usage, state.fingerprint)
    out += stripper.flush()
    return b"".join(out), state


@pytest.mark.parametrize("kind", ["chat", "completions"])
@pytest.mark.parametrize("chunk", [1, 7, 100_000])
def test_stripping_injected_usage_restores_vllm_bytes(kind: str, chunk: int) -> None:
    """Removing the usage frame we asked for yields exactly what vLLM sends without it."""
    s = _sections()
    with_usage = s[f"{kind}, stream, include_usage"].rstrip(b"\n") + b"\n\n"
    without = s[f"{kind}, stream, no include_usage"].rstrip(b"\n") + b"\n\n"
    stripped, state = _strip(with_usage, chunk)
    assert _normalise_ids(stripped) == _normalise_ids(without)
    assert state.usage is not None and state.usage["completion_tokens"] == 3
    assert state.finish_reason == "length" and state.done


def test_classify_counts_output_frames_not_role_or_usage() -> None:
    """The chat role frame and the usage frame carry no output; every token frame does."""
    state = StreamState()
    frames = FrameSplitter().feed(_sections()["chat, stream, include_usage"])
    flags = [classify(f, state) for f in frames]
    assert [out for out, _ in flags] == [False, True, True, True, False, False]
    assert [usage for _, usage in flags] == [False, False, False, False, True, False]
    assert state.output_frames == 3


def test_splitter_keeps_partial_frames_until_complete() -> None:
    """A frame split across reads is emitted once, whole."""
    sp = FrameSplitter()
    assert sp.feed(b'data: {"a"') == []
    assert sp.feed(b":1}\n") == []
    assert sp.feed(b"\ndata: [DONE]\n\n") == [b'data: {"a":1}\n\n', b"data: [DONE]\n\n"]
    assert sp.pending == b""


def test_error_frame_is_recorded() -> None:
    """An error object inside the stream is captured for the event."""
    state = StreamState()
    classify(b'data: {"error": {"message": "boom", "code": 500}}\n\n', state)
    assert state.error == {"message": "boom", "code": 500}


def test_malformed_frame_is_counted_not_raised() -> None:
    """Garbage in a frame is counted, never an exception on the relay path."""
    state = StreamState()
    assert classify(b"data: {not json\n\n", state) == (False, False)
    assert state.malformed == 1


def test_parsed_frames_read_as_their_payload_whatever_trails_it() -> None:
    """A frame whose payload ends in whitespace JSON does not allow (a form feed) reads as its
    payload; ``[DONE]`` ends the stream only alone; another ``[DONE]...`` is malformed."""
    state = StreamState()
    frame = b'data: {"choices": [{"index": 0, "text": "a", "finish_reason": null}]}\x0c\n\n'
    assert classify_parsed(frame, state) == (1, False)
    assert (state.tokens, state.malformed) == (1, 0)
    assert classify_parsed(b"data: [DONE]x\n\n", state) == (0, False)
    assert (state.done, state.malformed) == (False, 1)
    assert classify_parsed(b"data: [DONE] \r\n\n", state) == (0, False) and state.done


def test_spaced_frames_of_one_stream_classify_as_parsed() -> None:
    """Once a stream's frames are spaced JSON the byte search is skipped for it, and a later
    frame in vLLM's compact shape still counts as the parse counts it."""
    spaced = {"index": 0, "delta": {"content": "a"}, "finish_reason": None}
    compact = {**spaced, "logprobs": None, "finish_reason": "stop", "token_ids": None}
    frames = [
        b"data: " + json.dumps({"choices": [spaced]}).encode() + SEP,
        b"data: " + orjson.dumps({"choices": [compact]}) + SEP,
    ]
    fast, parsed = StreamState(), StreamState()
    assert [classify(f, fast) for f in frames] == [classify_parsed(f, parsed) for f in frames]
    assert fast.spaced and (fast.tokens, fast.finish_reason) == (2, "stop")
    assert _state(fast) == _state(parsed)


def test_add_fingerprint_appends_last_key_once() -> None:
    """The fingerprint goes in as the last key, and never twice."""
    frame = b'data: {"a":1}\n\n'
    once = add_fingerprint(frame, "fp")
    assert once == b'data: {"a":1,"system_fingerprint":"fp"}\n\n'
    assert add_fingerprint(once, "fp") == once


def test_splitter_returns_a_whole_single_frame_read_uncopied() -> None:
    """The common read (one whole frame) comes back as the same object, not a copy."""
    frame = b'data: {"a":1}\n\n'
    assert FrameSplitter().feed(frame)[0] is frame


@settings(max_examples=300, deadline=None)
@given(
    frames=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n\n", b"\n")), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
    extra_newlines=st.booleans(),
)
def test_splitter_matches_split_on_blank_lines(
    frames: list[bytes], cuts: list[int], extra_newlines: bool
) -> None:
    """However the stream is cut into reads, the frames are those of a split on blank lines."""
    stream = b"".join(f + SEP + (b"\n" if extra_newlines else b"") for f in frames) + b"tail"
    sp = FrameSplitter()
    got: list[bytes] = []
    prev = 0
    for cut in [*sorted(x for x in cuts if x < len(stream)), len(stream)]:
        got += sp.feed(stream[prev:cut])
        prev = cut
    parts = stream.split(SEP)
    assert got == [p + SEP for p in parts[:-1]]
    assert sp.pending == parts[-1]


# Frame shapes for the fast path: vLLM's, plus the shapes it must hand to the full parse.
_text = st.text(
    alphabet=st.sampled_from(['"', "\\", ":", ",", "{", "}", "a", " ", "\n", "é", "\u2028"]),
    max_size=30,
) | st.sampled_from(
    [
        "",
        '"finish_reason":"stop"',
        '","finish_reason":"stop',
        '"content":"x',
        '"usage":{"a":1}',
        '"content":""',
        '"text":""',
        '"role":"',
        '"token_ids":[1]',
        '"logprobs":{',
    ]
)


# Logprobs as vLLM writes them (chat, completions): one entry per token the frame carries.
_LOGPROBS: list[Any] = [
    {"content": [{"token": "a", "logprob": -1.0}, {"token": "", "logprob": -2.0}]},
    {"content": None},
    {"tokens": ["a"], "token_logprobs": [-1.0], "text_offset": [0], "top_logprobs": None},
]


@st.composite
def _frames(draw: st.DrawFn) -> bytes:
    chat = draw(st.booleans())
    choices = []
    for i in range(draw(st.sampled_from([0, 1, 1, 1, 2]))):
        c: dict[str, Any] = {"index": i}
        if chat:
            delta: dict[str, Any] = {}
            if draw(st.booleans()):
                delta["role"] = draw(st.sampled_from(["assistant", "assistant", None]))
            key = draw(st.sampled_from(["content", "reasoning_content", "reasoning", "none"]))
            if key != "none":
                delta[key] = draw(_text | st.none())
            if draw(st.integers(0, 5)) == 0:
                delta["tool_calls"] = draw(
                    st.sampled_from([[], [{"index": 0, "function": {"arguments": "{}"}}]])
                )
            if draw(st.integers(0, 8)) == 0:
                delta["function_call"] = draw(st.sampled_from([{}, {"name": "f"}]))
            c["delta"] = delta
        else:
            c["text"] = draw(_text)
        c["logprobs"] = draw(st.sampled_from([None, None, None, *_LOGPROBS]))
        c["finish_reason"] = draw(st.sampled_from([None, None, None, "stop", "length", "a\\b"]))
        if c["finish_reason"] is not None:
            c["stop_reason"] = None
        c["token_ids"] = draw(st.sampled_from([None, None, None, [], [5], [5, 6, 7]]))
        choices.append(c)
    obj: dict[str, Any] = {"id": "chatcmpl-1", "object": "chunk", "model": "m", "choices": choices}
    if not choices or draw(st.integers(0, 5)) == 0:
        obj["usage"] = draw(st.sampled_from([None, {"prompt_tokens": 1, "completion_tokens": 2}]))
    if draw(st.integers(0, 3)) == 0:
        obj["system_fingerprint"] = draw(st.sampled_from(["fp-1", "", "fp-2"]))
    if draw(st.integers(0, 10)) == 0:
        obj = {"error": {"message": draw(_text), "code": 500}}
    spaced = draw(st.integers(0, 5)) == 0
    body = json.dumps(obj, ensure_ascii=False).encode() if spaced else orjson.dumps(obj)
    return b"data: " + body + SEP


def _state(s: StreamState) -> tuple[object, ...]:
    return (
        s.output_frames,
        s.tokens,
        s.finish_reason,
        s.usage,
        s.error,
        s.done,
        s.fingerprint,
        s.malformed,
    )


@settings(max_examples=1500, deadline=None)
@given(frames=st.lists(_frames(), min_size=1, max_size=6))
def test_fast_classify_agrees_with_the_full_parse(frames: list[bytes]) -> None:
    """For any frame sequence, byte-search classification equals parsing every frame."""
    fast, parsed = StreamState(), StreamState()
    for frame in frames:
        assert classify(frame, fast) == classify_parsed(frame, parsed), frame
        assert _state(fast) == _state(parsed), frame


def test_fast_classify_agrees_on_every_captured_frame() -> None:
    """Every frame vLLM actually wrote classifies the same with and without parsing."""
    for section in _sections().values():
        fast, parsed = StreamState(), StreamState()
        for frame in FrameSplitter().feed(section.rstrip(b"\n") + b"\n\n"):
            assert classify(frame, fast) == classify_parsed(frame, parsed)
            assert _state(fast) == _state(parsed)


TOKEN_FRAMES = Path(__file__).resolve().parents[2] / "data" / "vllm-0.32-sse-token-frames.txt"


def _token_sections() -> dict[str, list[bytes]]:
    parts = re.split(rb"^### (.+)\n", TOKEN_FRAMES.read_bytes(), flags=re.M)
    return {
        parts[i].decode().split(" (")[0]: FrameSplitter().feed(parts[i + 1])
        for i in range(1, len(parts) - 1, 2)
    }


@pytest.mark.parametrize(
    ("section", "tokens", "frames"),
    [
        # The role frame carries no token; 23 frames of empty text and the last one do.
        ("chat, stream, greedy tokens that decode to empty text", 24, 24),
        ("completions, stream, greedy tokens that decode to empty text", 3, 3),
        # --stream-interval 2: a first frame of one token, then one of two, listed in logprobs.
        ("completions, stream, stream_interval 2 and logprobs 1", 3, 2),
    ],
)
def test_every_token_frame_counts_whatever_its_text(section: str, tokens: int, frames: int) -> None:
    """vLLM's token frames count with empty text too, and by the tokens a frame lists."""
    state = StreamState()
    for frame in _token_sections()[section]:
        classify(frame, state)
    assert (state.tokens, state.output_frames, state.finish_reason) == (tokens, frames, "length")


def test_first_token_frame_is_the_first_with_empty_text() -> None:
    """TTFT ends at the engine's first token frame, not at the first visible text."""
    state = StreamState()
    chat = _token_sections()["chat, stream, greedy tokens that decode to empty text"]
    assert [classify(f, state)[0] for f in chat[:3]] == [0, 1, 1]


def test_error_frame_code_says_whose_mistake() -> None:
    """A 4xx error frame (vLLM's top_logprobs over its limit) is the client's; 5xx the pool's."""
    state = StreamState()
    for frame in _token_sections()["chat, stream, top_logprobs 100"]:
        classify(frame, state)
    assert e.outcome(error_code(state.error)) == c.CLIENT_ERROR
    assert e.outcome(error_code({"message": "boom", "code": 500})) == c.ERROR
    assert e.outcome(error_code({"message": "no code"})) == c.ERROR
    assert e.outcome(error_code({"code": "404"})) == c.CLIENT_ERROR
    assert e.outcome(error_code({"code": True})) == c.ERROR
    assert error_code({"code": "\u00b2"}) is None  # a pool's code "²" is no status, no crash
