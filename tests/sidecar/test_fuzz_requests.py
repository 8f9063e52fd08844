"""Bad input from a client never crashes the sidecar, never loses an event, never leaks a
traceback: hypothesis-generated bodies, headers, methods and routes, relayed by a real sidecar
to the real vLLM engine (which answers the bad ones itself)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from obs import conventions as c
from obs.config import default_config_path
from obs.engines.server import VllmServer
from tests.conftest import SidecarFactory
from tests.support.event_log import EventLog
from tests.support.fuzz_support import (
    CHAT,
    FUZZ,
    JSON_SCALARS,
    JSON_VALUES,
    assert_event_well_typed,
    assert_no_crash_logged,
    assert_no_traceback,
    log_size,
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


ROUTES = (CHAT, "/v1/completions", "/tokenize")
KINDS = ("valid", "shaped", "json", "bytes", "empty")
METHODS = ("POST", "GET", "PUT")


@st.composite
def request_bodies(draw: st.DrawFn) -> tuple[str, bytes, str, str]:
    """(route, raw body, content-type, kind): valid requests with odd extras, odd ones, garbage."""
    route = draw(st.sampled_from([CHAT, *ROUTES]))
    kind = draw(st.sampled_from(["valid"] * 3 + ["shaped"] * 3 + list(KINDS[2:])))
    ctype = draw(st.sampled_from(["application/json"] * 6 + ["text/plain", "", "application/x"]))
    if kind == "bytes":
        return route, draw(st.binary(max_size=300)), ctype, kind
    if kind == "empty":
        return route, b"", ctype, kind
    if kind == "json":
        return route, json.dumps(draw(JSON_VALUES)).encode(), ctype, kind
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
    return route, json.dumps(body, ensure_ascii=draw(st.booleans())).encode(), ctype, kind


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

    shapes: set[tuple[str, str]] = set()  # (what was drawn, its value): each must come up

    # Derandomized: the same 80 examples every run (each is a real request to the engine),
    # with the rare kinds, routes and methods also given explicitly; the check after them
    # pins that every route, body kind and method came up.
    @settings(FUZZ, max_examples=80)
    @given(
        req=request_bodies(),
        headers=HEADERS,
        method=st.sampled_from(["POST"] * 8 + ["GET", "PUT"]),
    )
    @example(req=("/tokenize", b"", "", "empty"), headers={}, method="PUT")
    @example(req=("/v1/completions", b"\x00{\xff", "text/plain", "bytes"), headers={}, method="GET")
    @example(req=(CHAT, b"[1, null]", "application/json", "json"), headers={}, method="POST")
    def check(req: tuple[str, bytes, str, str], headers: dict[str, bytes], method: str) -> None:
        route, raw, ctype, kind = req
        shapes.update({("route", route), ("kind", kind), ("method", method)})
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
    wanted = {("route", r) for r in ROUTES} | {("kind", k) for k in KINDS}
    missing = (wanted | {("method", m) for m in METHODS}) - shapes
    assert not missing, f"never came up: {sorted(missing)}"
    assert httpx.get(sc.url + "/health").status_code == 200
    assert len(log.wait(sent[0])) == sent[0]
