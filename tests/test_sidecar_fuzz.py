"""Bad input never crashes the sidecar, never loses an event, never leaks a traceback.

Two directions, both against a real sidecar process:

- request side: hypothesis-generated bodies, headers, methods and routes from a
  client, relayed to the real vLLM engine (which answers the bad ones itself);
- upstream side: hypothesis-generated responses from a pool: malformed SSE
  frames, UTF-8 split across reads, huge lines, a missing ``[DONE]``, a stream
  cut mid-frame, odd JSON where vLLM puts numbers and strings.

The upstream side needs a fake pool (``ScriptedUpstream`` below) because no real
vLLM can be made to produce a malformed stream: it is a plain HTTP server that
writes back, byte for byte and read by read, the response each example scripts.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from obs import conventions as c
from obs.config import default_config_path
from obs.engine import VllmServer
from obs.events import Event
from obs.sidecar.testing import SidecarProcess

from .conftest import SidecarFactory
from .probes import DONE_FRAME, is_error_frame, label_values, sse_frames
from .scripted_upstream import Script, ScriptedUpstream

CHAT = "/v1/chat/completions"
# What the sidecar's own log must never contain: a request it could not handle.
CRASH_MARKERS = ("relay_internal_error", "Exception in ASGI application", "exporter_failed")
# The sidecar's error classes for a stream the pool answered 200 but did not finish.
STREAM_FAILURES = {"upstream_protocol", "upstream_stream_error", "upstream_timeout"}

FUZZ = settings(
    max_examples=60,
    deadline=None,
    database=None,
    derandomize=True,  # the same examples on every run: CI failures reproduce
    report_multiple_bugs=False,  # shrink one failure, not all (each example is a real request)
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,  # one sidecar serves every example on purpose
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


# ---- checks shared by both directions ---------------------------------------------------


def _allowed_types(annotation: str) -> tuple[type, ...]:
    names = {"int": int, "str": str, "float": float, "bool": bool, "None": type(None)}
    out: list[type] = []
    for part in str(annotation).split(" | "):
        out.append(names[part])
        if part == "float":
            out.append(int)  # JSON has one number type; 3 is a fine float
    return tuple(out)


FIELD_TYPES = {f.name: _allowed_types(str(f.type)) for f in fields(Event)}


def assert_event_well_typed(event: dict[str, Any]) -> None:
    """Every field of the event has the type the schema documents (no bools for ints)."""
    assert set(event) == set(FIELD_TYPES), set(event) ^ set(FIELD_TYPES)
    for name, value in event.items():
        allowed = FIELD_TYPES[name]
        ok = isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed)
        assert ok, f"event field {name}={value!r} is not {allowed}"


def log_size(sc: SidecarProcess) -> int:
    return sc.log_path.stat().st_size if sc.log_path and sc.log_path.exists() else 0


def assert_no_crash_logged(sc: SidecarProcess, since: int) -> None:
    """The sidecar logged no failure of its own after byte ``since`` of its log."""
    assert sc.log_path is not None
    with sc.log_path.open("rb") as f:
        f.seek(since)
        new = f.read().decode(errors="replace")
    for line in new.splitlines():
        if any(marker in line for marker in CRASH_MARKERS):
            last = line.replace("\\n", "\n").rstrip('"}').splitlines()[-1]
            raise AssertionError(f"the sidecar failed on this input: {last}\n{line[:2000]}")


def assert_no_traceback(body: bytes) -> None:
    assert b"Traceback" not in body and b'File "' not in body, body[:500]


class EventLog:
    """Reads a sidecar's event log as it grows, keeping every event by request id."""

    def __init__(self, sc: SidecarProcess) -> None:
        assert sc.events_path is not None
        self.path = sc.events_path
        self.offset = 0
        self.events: list[dict[str, Any]] = []

    def _read(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        whole = data[: data.rfind(b"\n") + 1]
        self.offset += len(whole)
        self.events += [orjson.loads(line) for line in whole.splitlines() if line.strip()]

    def wait(self, n: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """Every event once there are at least ``n`` (or the timeout passed)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._read()
            if len(self.events) >= n or time.monotonic() > deadline:
                return self.events
            time.sleep(0.005)

    def one(self, request_id: str, timeout_s: float = 3.0) -> dict[str, Any]:
        """The event of ``request_id``; fails unless exactly one is written."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._read()
            mine = [e for e in self.events[-50:] if e["request_id"] == request_id]
            if mine or time.monotonic() > deadline:
                break
            time.sleep(0.005)
        assert mine, f"no event for request {request_id}"
        time.sleep(0.01)
        self._read()
        mine = [e for e in self.events[-50:] if e["request_id"] == request_id]
        assert len(mine) == 1, f"{len(mine)} events for one request"
        return mine[0]


# ---- request side: a real sidecar in front of the real engine ---------------------------

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=12,
)
# A valid max_tokens keeps generation short; invalid ones vLLM rejects. Never absent (an
# absent max_tokens lets the tiny model generate up to its context: seconds per example).
MAX_TOKENS = st.integers(1, 6) | st.sampled_from([0, -1, 10**9, 2**64, 1.5, True, "8", [4]])
CONTENT = st.one_of(
    st.text(max_size=200),
    st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "image_url"]), "text": JSON_VALUES}
        ),
        max_size=3,
    ),
    JSON_VALUES,
)
MESSAGES = st.one_of(
    st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system", "assistant", "tool", "nobody"])},
            optional={"content": CONTENT, "name": JSON_VALUES},
        ),
        max_size=4,
    ),
    JSON_VALUES,
)
PROMPT = st.one_of(
    st.text(max_size=200),
    st.lists(st.integers(0, 4095), max_size=20),  # token ids inside the tiny model's vocabulary
    st.lists(st.text(max_size=20), max_size=3),
    JSON_SCALARS,
)


@st.composite
def request_bodies(draw: st.DrawFn) -> tuple[str, bytes, str]:
    """(route, raw body, content-type): valid requests with odd extras, odd ones, garbage."""
    route = draw(st.sampled_from([CHAT, CHAT, "/v1/completions", "/tokenize"]))
    kind = draw(st.sampled_from(["valid"] * 3 + ["shaped"] * 3 + ["json", "bytes", "empty"]))
    ctype = draw(st.sampled_from(["application/json"] * 6 + ["text/plain", "", "application/x"]))
    if kind == "bytes":
        return route, draw(st.binary(max_size=300)), ctype
    if kind == "empty":
        return route, b"", ctype
    if kind == "json":
        return route, json.dumps(draw(JSON_VALUES)).encode(), ctype
    body: dict[str, Any]
    if kind == "valid":  # what vLLM serves, with the fields the sidecar reads made odd
        body = {"model": "tiny", "max_tokens": draw(st.integers(1, 6))}
        if route == CHAT:
            body["messages"] = [{"role": "user", "content": draw(st.text(max_size=200))}]
        else:
            body["prompt"] = draw(st.text(min_size=1, max_size=200))
        stream: Any = draw(st.booleans())
    else:
        body = {"max_tokens": draw(MAX_TOKENS)}
        body["model"] = draw(st.sampled_from(["tiny", "tiny", "tiny", "nope"]) | JSON_SCALARS)
        if route == CHAT:
            body["messages"] = draw(MESSAGES)
        else:
            body["prompt"] = draw(PROMPT)
        stream = draw(st.booleans() | JSON_SCALARS)
    body["stream"] = stream
    optional = {
        "stream_options": st.fixed_dictionaries({"include_usage": JSON_SCALARS}) | JSON_VALUES,
        "temperature": st.floats(0, 2) | JSON_SCALARS,
        "max_completion_tokens": MAX_TOKENS,
    }
    for key, strategy in optional.items():
        if draw(st.booleans()):
            body[key] = draw(strategy)
    extras = draw(st.dictionaries(st.text(max_size=10).map(lambda k: f"fuzz_{k}"), JSON_VALUES))
    body.update(extras)
    return route, json.dumps(body, ensure_ascii=draw(st.booleans())).encode(), ctype


# Header values as HTTP allows them: visible ASCII, spaces, tabs and obs-text bytes.
HEADER_VALUE = st.binary(max_size=300).map(
    lambda b: bytes(x for x in b if x == 9 or 32 <= x <= 126 or x >= 128).strip()
)
HEADERS = st.dictionaries(
    st.sampled_from(
        [
            "x-request-id",
            "traceparent",
            "tracestate",
            "accept",
            "authorization",
            "x-client-class",
            "x-fuzz",
        ]
    ),
    HEADER_VALUE
    | st.sampled_from(
        [
            b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            b"00-00000000000000000000000000000000-0000000000000000-01",
            b"chat",
            b"batch",
            b"long-prefill",
            b"x" * 5000,
        ]
    ),
    max_size=4,
)


def _lanes_config(tmp_path: Path, upstream: str) -> Path:
    """The shipped six-lane config with both pools pointed at ``upstream``."""
    data = yaml.safe_load(default_config_path().read_text())
    for pool in data["pools"]:
        pool["replicas"] = [upstream]
    path = tmp_path / "lanes.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.engine
def test_fuzzed_requests_get_clean_answers_and_one_event_each(
    vllm: VllmServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """Any body, header, method or route: an answer without a traceback and exactly one event."""
    sc = sidecar(config=_lanes_config(tmp_path, vllm.url), traces=False)
    log = EventLog(sc)
    sent = [0]
    client = httpx.Client(base_url=sc.url, timeout=60)

    @settings(FUZZ, max_examples=150)
    @given(
        req=request_bodies(),
        headers=HEADERS,
        method=st.sampled_from(["POST"] * 8 + ["GET", "PUT"]),
    )
    def check(req: tuple[str, bytes, str], headers: dict[str, bytes], method: str) -> None:
        route, raw, ctype = req
        mark = log_size(sc)
        hdrs = {k.encode(): v for k, v in headers.items()}
        if ctype:
            hdrs[b"content-type"] = ctype.encode()
        rid = None
        if b"x-request-id" not in hdrs:
            rid = uuid.uuid4().hex
            hdrs[b"x-request-id"] = rid.encode()
        before = len(log.wait(sent[0], timeout_s=0))
        r = client.request(method, route, content=raw, headers=hdrs)
        sent[0] += 1
        assert_no_traceback(r.content)
        if r.status_code >= 400:
            # A JSON error: OpenAI-style from the sidecar or vLLM, or FastAPI's {"detail"}
            # that vLLM itself answers on some routes (relayed as it came).
            error = orjson.loads(r.content)
            assert isinstance(error, dict) and ("error" in error or "detail" in error), r.content
        if rid is not None:
            event = log.one(rid)
        else:  # the client's own (fuzzed) id: the one new event
            events = log.wait(before + 1)
            assert len(events) == before + 1, "no event, or more than one"
            event = events[-1]
        assert_event_well_typed(event)
        assert event["http_status"] == r.status_code
        assert event["error_class"] != "internal", event["error_message"]
        expected = {2: {c.OK}, 4: {c.CLIENT_ERROR, c.REJECTED}, 5: {c.ERROR, c.REJECTED}}
        assert event["status"] in expected[r.status_code // 100], (r.status_code, event)
        assert_no_crash_logged(sc, mark)

    try:
        check()
    finally:
        client.close()
    assert httpx.get(sc.url + "/health").status_code == 200
    assert len(log.wait(sent[0], timeout_s=2)) == sent[0]


# ---- upstream side: a scripted pool -----------------------------------------------------


@pytest.fixture
def upstream() -> Iterator[ScriptedUpstream]:
    """The scripted fake pool (see ``ScriptedUpstream``: no real vLLM sends bad streams)."""
    with ScriptedUpstream() as fake:
        yield fake


def _frame(obj: Any) -> bytes:
    """One SSE frame as vLLM writes it: compact JSON, UTF-8."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return b"data: " + text.encode() + b"\n\n"


def _chunk(choice: dict[str, Any], **extra: Any) -> bytes:
    base = {"id": "chatcmpl-f", "object": "chat.completion.chunk", "created": 0, "model": "tiny"}
    return _frame({**base, "choices": [{"index": 0, **choice}], **extra})


TEXT = st.text(st.characters(codec="utf-8"), max_size=40)  # multi-byte UTF-8 included
GOOD_FRAMES = st.one_of(
    TEXT.map(lambda t: _chunk({"delta": {"content": t}, "finish_reason": None})),
    st.sampled_from(["stop", "length", "abort"]).map(
        lambda r: _chunk({"delta": {"content": ""}, "finish_reason": r}, system_fingerprint=None)
    ),
    st.tuples(st.integers(0, 5000), st.integers(0, 5000), st.integers(0, 5000)).map(
        lambda t: _frame(
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
    ).map(_frame),
    JSON_VALUES.map(_frame),
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
HUGE_FRAMES = st.sampled_from([70_000, 1_000_000, 3_000_000]).map(
    lambda n: _chunk({"delta": {"content": "\u00e9" * n}, "finish_reason": None})
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
    assert len(log.wait(sent[0], timeout_s=2)) == sent[0]


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
    assert len(log.wait(sent[0], timeout_s=2)) == sent[0]


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
                _chunk({"delta": {"content": "a"}, "finish_reason": f"reason-{i}"}),
                DONE_FRAME,
            ]
            upstream.scripts[rid] = Script(pieces=frames)
            body = {"model": "tiny", "messages": [], "max_tokens": 1, "stream": True}
            r = client.post(CHAT, json=body, headers={"x-request-id": rid})
            assert r.status_code == 200
    assert len(sc.wait_events(n)) == n
    reasons = label_values(sc.url, "vllm_obs_requests_total", c.FINISH_REASON)
    assert reasons <= {*c.FINISH_REASONS, c.OVERFLOW_LABEL}, sorted(reasons)[:10]
