"""SGLang's and TGI's streams through the relay's framing, classification and usage rewrite.

Neither engine runs on these CPU-only machines: the streams are written from their
published sources (tests/data/README.md names release and file). llama.cpp's stream
here is a capture of the real llama-server; test_llamacpp.py runs against the server.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from obs.events import Event
from obs.sidecar.relay.payloads import apply_usage
from obs.sidecar.relay.sse import FrameSplitter, StreamState, UsageStripper, classify, move_timings

DATA = Path(__file__).parents[1] / "data"


def _frames(name: str) -> list[bytes]:
    return FrameSplitter().feed((DATA / name).read_bytes())


def _relay(frames: list[bytes], inject: bool) -> tuple[bytes, StreamState]:
    """What the relay sends on: every frame, or (usage injected) all but the usage frame."""
    state, stripper, out = StreamState(), UsageStripper(), []
    for frame in frames:
        _, is_usage = classify(frame, state)
        out += stripper.process(frame, is_usage, state.fingerprint) if inject else [frame]
    out += stripper.flush() if inject else []
    return b"".join(out), state


@pytest.mark.parametrize(
    ("capture", "outputs"),
    # SGLang finishes in a frame of its own (it counts as output), TGI on the last token.
    [("sglang-sse-capture.txt", 3), ("tgi-sse-capture.txt", 2)],
)
def test_stream_asked_for_usage_is_relayed_byte_for_byte(capture: str, outputs: int) -> None:
    """A client that asked for usage gets the engine's frames unchanged."""
    frames = _frames(capture)
    relayed, state = _relay(frames, inject=False)
    assert relayed == b"".join(frames)
    assert state.finish_reason == "length" and state.done and state.output_frames == outputs


@pytest.mark.parametrize("capture", ["sglang-sse-capture.txt", "tgi-sse-capture.txt"])
def test_injected_usage_frame_is_removed_and_nothing_else_changes(capture: str) -> None:
    """Usage the sidecar asked for is taken out; the other frames pass as the engine sent them."""
    frames = _frames(capture)
    relayed, _ = _relay(frames, inject=True)
    without_usage = [f for f in frames if b'"choices":[]' not in f]
    assert relayed == b"".join(without_usage)


def test_sglang_usage_gives_cached_tokens() -> None:
    """SGLang (--enable-cache-report) puts cached tokens where vLLM does: the event has them."""
    _, state = _relay(_frames("sglang-sse-capture.txt"), inject=False)
    ev = Event()
    apply_usage(ev, state)
    assert (ev.prompt_tokens, ev.completion_tokens, ev.cached_tokens) == (21, 2, 16)


def test_tgi_usage_has_no_cached_tokens_so_the_field_stays_null() -> None:
    """TGI's usage has no cached-token count: cached_tokens is null, not 0."""
    _, state = _relay(_frames("tgi-sse-capture.txt"), inject=False)
    ev = Event()
    apply_usage(ev, state)
    assert (ev.prompt_tokens, ev.completion_tokens) == (21, 2)
    assert ev.cached_tokens is None and ev.finish_reason == "length"


def test_tgi_error_frame_is_recognised() -> None:
    """TGI's error frame ({"error": str, "error_type": str}) is read as the stream's error."""
    state = StreamState()
    (frame,) = _frames("tgi-sse-error.txt")
    assert classify(frame, state) == (False, False)
    assert state.error is not None and "validation error" in state.error["message"]


def _llamacpp_sections() -> dict[str, bytes]:
    text = (DATA / "llamacpp-sse-capture.txt").read_bytes()
    parts = re.split(rb"^### (.+)\n", text, flags=re.M)
    return {parts[i].decode(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def _timings(frame: bytes) -> bytes:
    found = re.search(rb'"timings":\{[^}]*\}', frame)
    return found.group(0) if found else b""


def test_llamacpp_timings_go_back_to_the_finishing_frame() -> None:
    """With usage injected, llama.cpp's timings return to the frame it would have put them on."""
    s = _llamacpp_sections()
    with_usage = FrameSplitter().feed(s["chat, stream, include_usage"])
    without = FrameSplitter().feed(s["chat, stream, no include_usage"])
    relayed, state = _relay(with_usage, inject=True)
    frames = FrameSplitter().feed(relayed)
    volatile = re.compile(rb'"(created|id)":("[^"]*"|\d+)|"timings":\{[^}]*\}')
    assert [volatile.sub(b"", f) for f in frames] == [volatile.sub(b"", f) for f in without]
    assert _timings(frames[-2]) == _timings(with_usage[-2]) != b""  # the usage frame's own
    assert state.usage is not None and state.usage["prompt_tokens_details"]["cached_tokens"] > 0


def test_llamacpp_stream_without_usage_is_left_alone() -> None:
    """A finishing frame that has its own timings is not given a second copy."""
    without = FrameSplitter().feed(_llamacpp_sections()["chat, stream, no include_usage"])
    assert move_timings(without[-2], without[-2]) == without[-2]
