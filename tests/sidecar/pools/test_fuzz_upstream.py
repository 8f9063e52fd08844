"""A pool's bad answers never crash the sidecar, never lose an event, never leak a traceback:
hypothesis-generated responses (malformed SSE frames, UTF-8 split across reads, huge lines, a
missing ``[DONE]``, a stream cut mid-frame, odd JSON where vLLM puts numbers and strings).

The pool is a fake (``ScriptedUpstream``) because no real vLLM can be made to produce a
malformed stream: a plain HTTP server that writes back, byte for byte and read by read, the
response each example scripts.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from obs import conventions as c
from tests.conftest import SidecarFactory
from tests.support.event_log import EventLog
from tests.support.fuzz_support import (
    CHAT,
    FUZZ,
    JSON_VALUES,
    STREAM_FAILURES,
    assert_event_well_typed,
    assert_no_crash_logged,
    assert_no_traceback,
    log_size,
)
from tests.support.probes import DONE_FRAME, is_error_frame, label_values, sse_frames
from tests.support.scripted_upstream import Script, ScriptedUpstream, chunk_frame, sse_frame


@pytest.fixture
def upstream() -> Iterator[ScriptedUpstream]:
    """The scripted fake pool (see ``ScriptedUpstream``: no real vLLM sends bad streams)."""
    with ScriptedUpstream() as fake:
        yield fake


TEXT = st.text(st.characters(codec="utf-8"), max_size=40)  # multi-byte UTF-8 included
GOOD_FRAMES = st.one_of(
    TEXT.map(lambda t: chunk_frame({"delta": {"content": t}, "finish_reason": None})),
    st.sampled_from(["stop", "length", "abort"]).map(
        lambda r: chunk_frame(
            {"delta": {"content": ""}, "finish_reason": r}, system_fingerprint=None
        )
    ),
    st.tuples(st.integers(0, 5000), st.integers(0, 5000), st.integers(0, 5000)).map(
        lambda t: sse_frame(
            {
                "id": "chatcmpl-f",
                "object": "chat.completion.chunk",
                "choices": [],
                "usage": {
                    "prompt_tokens": t[0],
                    "completion_tokens": t[1],
                    "total_tokens": t[0] + t[1],
                    "prompt_tokens_details": {"cached_tokens": min(t[2], t[0])},
                },
            }
        )
    ),
)
# vLLM's usage object with anything where vLLM puts its token counts.
ODD_USAGE = JSON_VALUES | st.fixed_dictionaries(
    {},
    optional={
        "prompt_tokens": JSON_VALUES,
        "completion_tokens": JSON_VALUES,
        "prompt_tokens_details": st.fixed_dictionaries({}, optional={"cached_tokens": JSON_VALUES}),
    },
)
# vLLM's shape with anything where vLLM puts a number, a string or a list.
ODD_JSON_FRAMES = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "choices": JSON_VALUES
            | st.lists(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "delta": JSON_VALUES,
                        "text": JSON_VALUES,
                        "finish_reason": JSON_VALUES,
                    },
                ),
                max_size=2,
            ),
            "usage": ODD_USAGE,
            "system_fingerprint": JSON_VALUES,
        },
    ).map(sse_frame),
    JSON_VALUES.map(sse_frame),
)
GARBAGE_FRAMES = st.one_of(
    st.binary(max_size=120)
    .filter(lambda b: b"\n\n" not in b and b"[DONE]" not in b and not b.endswith(b"\n"))
    .map(lambda b: b"data: " + b + b"\n\n"),
    st.sampled_from(
        [
            b": keep-alive\n\n",
            b"event: ping\ndata: {}\n\n",
            b"id: 7\nretry: 10\n\n",
            b"data:{}\n\n",
            b'data: {"choices": [\n\n',
            b"\n\n",
        ]
    ),
)
HUGE = chunk_frame({"delta": {"content": "\u00e9" * 70_000}, "finish_reason": None})
HUGE_FRAMES = st.sampled_from([70_000, 1_000_000, 3_000_000]).map(
    lambda n: chunk_frame({"delta": {"content": "\u00e9" * n}, "finish_reason": None})
)
FRAMES = st.one_of(GOOD_FRAMES, GOOD_FRAMES, ODD_JSON_FRAMES, GARBAGE_FRAMES)


@st.composite
def stream_scripts(draw: st.DrawFn) -> Script:
    """A streamed answer: frames, cut into reads anywhere (UTF-8 included), maybe unfinished."""
    frames = draw(st.lists(FRAMES, max_size=10))
    if draw(st.integers(0, 9)) == 9:  # rare, and shrinks away
        frames.insert(draw(st.integers(0, len(frames))), draw(HUGE_FRAMES))
    ending = draw(st.sampled_from(["done", "done", "eof", "cut"]))
    body = b"".join(frames) + (DONE_FRAME if ending == "done" else b"")
    if ending != "done" and draw(st.booleans()):
        body += draw(st.binary(min_size=1, max_size=40).filter(lambda b: b"\n\n" not in b))
    if ending == "cut":
        body = body[: draw(st.integers(0, len(body)))]
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(body) - 1)), max_size=12))))
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    status = draw(st.sampled_from([200] * 12 + [400, 500, 503]))
    return Script(status=status, pieces=pieces, ending=ending)


def _upstream_view(script: Script) -> tuple[bytes, bool, bool]:
    """(the complete frames the pool sent, did it finish with [DONE], did it send an error)."""
    sent = script.body
    complete = sent[: sent.rfind(b"\n\n") + 2] if b"\n\n" in sent else b""
    frames = sse_frames(complete)
    finished = script.ending != "cut" and DONE_FRAME[:-2] in frames
    return complete, finished, any(_is_error_payload(f) for f in frames)


def _is_error_payload(frame: bytes) -> bool:
    """A frame the sidecar reads as the pool reporting an error: a JSON object with "error"."""
    if not frame.startswith(b"data: "):
        return False
    try:
        obj = orjson.loads(frame[6:].rstrip())
    except orjson.JSONDecodeError:
        return False
    return isinstance(obj, dict) and "error" in obj


def _check_stream(script: Script, include_usage: bool, status: int, body: bytes) -> None:
    """What a client must receive for ``script``: the pool's frames, then a clean ending."""
    assert_no_traceback(body[len(script.body) :])
    if script.status != 200:
        if script.ending == "cut":  # the error answer itself broke off: our own 502
            assert status == 502 and orjson.loads(body)["error"]["code"] == 502
        else:  # an error status is relayed as it came
            assert (status, body) == (script.status, script.body)
        return
    assert status == 200
    complete, finished, upstream_error = _upstream_view(script)
    if include_usage:  # nothing to rewrite: the pool's bytes, byte for byte
        if finished:
            assert body == script.body
        assert body.startswith(complete)
    if finished:
        assert body.endswith(DONE_FRAME)
        return
    if upstream_error:
        return  # the pool's own error frame told the client (vLLM then sends [DONE] itself)
    # An unfinished stream ends with frames any SSE client can parse: an error frame,
    # then [DONE]. A partial last frame from the pool must not spoil them.
    assert body.endswith(DONE_FRAME), f"stream ends without [DONE]: {body[-200:]!r}"
    frames = sse_frames(body)
    assert is_error_frame(frames[-2]), f"frame before [DONE] is not an error: {frames[-2][:300]!r}"


def _expected_status(script: Script) -> set[str]:
    if script.status == 503 and script.ending != "cut":
        return {c.ERROR, c.REJECTED}  # vLLM sheds load with 503: the engine's queue is full
    if script.status != 200:
        return {
            c.CLIENT_ERROR if 400 <= script.status < 500 and script.ending != "cut" else c.ERROR
        }
    _, finished, upstream_error = _upstream_view(script)
    return {c.OK if finished and not upstream_error else c.ERROR}


NULL_CHOICE = b'data: {"choices":[null]}\n\n'
LIST_PROMPT_TOKENS = b'data: {"usage":{"prompt_tokens":[]}}\n\n'
LIST_CACHED_TOKENS = b'data: {"usage":{"prompt_tokens_details":{"cached_tokens":[]}}}\n\n'


@pytest.mark.process
def test_fuzzed_upstream_streams_end_cleanly_with_one_event_each(
    upstream: ScriptedUpstream, sidecar: SidecarFactory
) -> None:
    """Malformed, split, huge, unfinished or cut streams: clean end, one well-typed event."""
    sc = sidecar(upstream.url, traces=False)
    log = EventLog(sc)
    sent = [0]
    client = httpx.Client(base_url=sc.url, timeout=60)

    @FUZZ
    @given(script=stream_scripts(), include_usage=st.booleans())
    # Cases the fuzzing found, kept as explicit examples (each failed once):
    # a partial last frame glued to the sidecar's error frame,
    @example(script=Script(pieces=[b"\x00"], ending="eof"), include_usage=False)
    # choices that are not objects (the relay raised, cutting the stream: "internal"),
    @example(script=Script(pieces=[NULL_CHOICE, DONE_FRAME]), include_usage=True)
    # usage counts that are not numbers (written into the event as they came),
    @example(script=Script(pieces=[LIST_PROMPT_TOKENS, DONE_FRAME]), include_usage=True)
    # and a cached_tokens list that made the event disappear (TypeError after the response).
    @example(script=Script(pieces=[LIST_CACHED_TOKENS, DONE_FRAME]), include_usage=False)
    # The rare kinds, whatever FUZZ's 40 drawn examples are: a huge frame cut off mid-way
    # (split over reads), and the pool's error status.
    @example(script=Script(pieces=[HUGE[:40_000], HUGE[40_000:90_000]], ending="cut"),
             include_usage=True)  # fmt: skip
    @example(script=Script(status=503, pieces=[b'{"error": {"message": "busy"}}'], ending="eof"),
             include_usage=False)  # fmt: skip
    def check(script: Script, include_usage: bool) -> None:
        rid = uuid.uuid4().hex
        mark = log_size(sc)
        upstream.scripts[rid] = script
        body: dict[str, Any] = {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}
        body |= {"max_tokens": 5, "stream": True}
        if include_usage:
            body["stream_options"] = {"include_usage": True}
        try:
            with client.stream("POST", CHAT, json=body, headers={"x-request-id": rid}) as r:
                received = r.read()
        finally:
            del upstream.scripts[rid]
        sent[0] += 1
        _check_stream(script, include_usage, r.status_code, received)
        event = log.one(rid)
        assert_event_well_typed(event)
        assert event["status"] in _expected_status(script), event
        if event["status"] == c.ERROR and script.status == 200:
            assert event["error_class"] in STREAM_FAILURES, event
            assert event["http_status"] == 200
        assert_no_crash_logged(sc, mark)

    try:
        check()
    finally:
        client.close()
    assert httpx.get(sc.url + "/health").status_code == 200
    assert len(log.wait(sent[0])) == sent[0]


@st.composite
def whole_scripts(draw: st.DrawFn) -> Script:
    """A non-streamed answer: any status and content type; mostly vLLM-shaped odd JSON."""
    shaped = st.fixed_dictionaries(
        {
            "choices": st.lists(
                st.fixed_dictionaries(
                    {},
                    optional={"message": JSON_VALUES, "finish_reason": JSON_VALUES},
                ),
                max_size=2,
            )
            | JSON_VALUES,
            "usage": ODD_USAGE,
        },
        optional={"id": JSON_VALUES},
    )
    kind = draw(st.sampled_from(["shaped", "shaped", "shaped", "json", "bytes"]))
    if kind == "bytes":
        raw = draw(st.binary(max_size=200))
    else:
        raw = json.dumps(draw(shaped if kind == "shaped" else JSON_VALUES)).encode()
    ctype = draw(st.sampled_from(["application/json"] * 4 + ["text/plain", "text/event-stream"]))
    status = draw(st.sampled_from([200] * 6 + [201, 400, 404, 422, 500, 502, 503]))
    ending = draw(st.sampled_from(["eof", "eof", "eof", "cut"]))
    return Script(status=status, content_type=ctype, pieces=[raw], ending=ending)


@pytest.mark.process
def test_fuzzed_upstream_whole_answers_are_relayed_with_one_event_each(
    upstream: ScriptedUpstream, sidecar: SidecarFactory
) -> None:
    """Non-streamed answers of any shape: relayed or cleanly failed, one well-typed event each."""
    sc = sidecar(upstream.url, traces=False)
    log = EventLog(sc)
    sent = [0]
    client = httpx.Client(base_url=sc.url, timeout=60)

    @FUZZ
    @given(script=whole_scripts())
    # Found by fuzzing: a finish reason and a cached_tokens that are not what vLLM sends.
    @example(
        script=Script(
            content_type="application/json",
            pieces=[b'{"choices":[{"finish_reason":[]}],"usage":{"prompt_tokens":"7"}}'],
            ending="eof",
        )
    )
    @example(
        script=Script(
            content_type="application/json",
            pieces=[b'{"choices":[],"usage":{"prompt_tokens_details":{"cached_tokens":[]}}}'],
            ending="eof",
        )
    )
    # The rare kinds, whatever FUZZ's 40 drawn examples are: an error answer cut off, typed
    # as a stream.
    @example(script=Script(status=500, content_type="text/event-stream", pieces=[b"data: {"],
                           ending="cut"))  # fmt: skip
    def check(script: Script) -> None:
        rid = uuid.uuid4().hex
        mark = log_size(sc)
        upstream.scripts[rid] = script
        body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5}
        try:
            r = client.post(CHAT, json=body, headers={"x-request-id": rid})
        finally:
            del upstream.scripts[rid]
        sent[0] += 1
        assert_no_traceback(r.content)
        event = log.one(rid)
        assert_event_well_typed(event)
        assert event["error_class"] != "internal", event
        whole = script.content_type != "text/event-stream" or script.status >= 400
        if whole and script.ending == "cut":  # the answer broke off: our own 502
            assert r.status_code == 502 and orjson.loads(r.content)["error"]["code"] == 502
            assert event["error_class"] == "upstream_protocol"
        elif whole:
            assert (r.status_code, r.content) == (script.status, script.body)
        assert event["http_status"] == r.status_code
        assert_no_crash_logged(sc, mark)

    try:
        check()
    finally:
        client.close()
    assert len(log.wait(sent[0])) == sent[0]


def test_pool_inventing_finish_reasons_cannot_grow_label_cardinality(
    upstream: ScriptedUpstream, sidecar: SidecarFactory
) -> None:
    """Made-up finish reasons from a pool fold into a bounded set of metric label values."""
    sc = sidecar(upstream.url, traces=False)
    n = 3 * c.MAX_MODEL_LABELS
    with httpx.Client(base_url=sc.url, timeout=30) as client:
        for i in range(n):
            rid = uuid.uuid4().hex
            frames = [
                chunk_frame({"delta": {"content": "a"}, "finish_reason": f"reason-{i}"}),
                DONE_FRAME,
            ]
            upstream.scripts[rid] = Script(pieces=frames)
            body = {"model": "tiny", "messages": [], "max_tokens": 1, "stream": True}
            r = client.post(CHAT, json=body, headers={"x-request-id": rid})
            assert r.status_code == 200
    assert len(sc.wait_events(n)) == n
    reasons = label_values(sc.url, "vllm_obs_requests_total", c.FINISH_REASON)
    assert reasons <= {*c.FINISH_REASONS, c.OVERFLOW_LABEL}, sorted(reasons)[:10]
