"""SSE framing, classification and the usage rewrite, against vLLM's captured output."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from obs.sidecar.sse import FrameSplitter, StreamState, UsageStripper, add_fingerprint, classify

CAPTURE = Path(__file__).resolve().parent / "data" / "vllm-0.32-sse-capture.txt"


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


def test_add_fingerprint_appends_last_key_once() -> None:
    """The fingerprint goes in as the last key, and never twice."""
    frame = b'data: {"a":1}\n\n'
    once = add_fingerprint(frame, "fp")
    assert once == b'data: {"a":1,"system_fingerprint":"fp"}\n\n'
    assert add_fingerprint(once, "fp") == once
