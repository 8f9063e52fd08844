"""Refusals of a request's size or head (413, 414, 431, and 408 or 400 within the head): each
request the client sent a head for has exactly one event, with the status the client read.

Raw sockets against the in-process sidecar (issue 45 item 1): a request line, headers or a
body past the limits is what an attacker sends, and no pool is reached. A request line
that never ended (414) is no request: nothing to record (no route, no headers, its target
cut), so no event; the refusal counter counts it.
"""

from __future__ import annotations

import json

import pytest

from obs import conventions as c
from obs.sidecar.relay.bodies import OFF_LOOP_BYTES
from obs.sidecar.server.limits import Limits
from tests.sidecar.conftest import InprocFactory
from tests.support.inproc import InProcessSidecar, lane_config, request_id
from tests.support.probes import CHAT, metric
from tests.support.rawhttp import connect, exchange, read_all, status
from tests.support.scripted_upstream import ScriptedUpstream

MAX_BODY = 300 << 10  # Settings.max_body_bytes: over OFF_LOOP_BYTES, so values are counted
MAX_VALUES = 1_000  # --max-json-elements
MAX_HEADER_BYTES = 16 << 10
MAX_HEADERS = 20
HEADER_TIMEOUT_S = 0.3


@pytest.fixture(scope="module")
def sidecar(scripted: ScriptedUpstream, inproc: InprocFactory) -> InProcessSidecar:
    """An in-process sidecar with small limits on the head, the body and its JSON values."""
    limits = Limits(
        max_header_bytes=MAX_HEADER_BYTES,
        max_headers=MAX_HEADERS,
        header_timeout_s=HEADER_TIMEOUT_S,
        max_client_body_memory=4 * MAX_BODY,
    )
    return inproc(
        lane_config({"main": [scripted.url]}),
        limits=limits,
        max_body_bytes=MAX_BODY,
        max_json_elements=MAX_VALUES,
    )


def _post(rid: str, body: bytes, *more: bytes) -> bytes:
    """A chat POST of ``body``, its request id first, ``more`` header lines after it."""
    return (
        b"POST %b HTTP/1.1\r\nhost: x\r\nx-request-id: %b\r\n%bcontent-type: application/json\r\n"
        b"connection: close\r\ncontent-length: %d\r\n\r\n%b"
        % (CHAT.encode(), rid.encode(), b"".join(more), len(body), body)
    )


def _limit_hits(sidecar: InProcessSidecar, limit: str) -> float:
    return metric(sidecar.url, c.CONNECTION_LIMITS.name + "_total", limit=limit)


def _refused(sidecar: InProcessSidecar, rid: str, answer: bytes, code: int) -> dict[str, object]:
    """The one event of ``rid``, after checking the client read ``code`` and the event says
    so: the client's error (4xx), never the pool's (none was asked)."""
    assert status(answer) == code, answer[:200]
    ev = sidecar.event(rid)  # exactly one, or it fails
    assert (ev["http_status"], ev["status"], ev["route"]) == (code, c.CLIENT_ERROR, CHAT), ev
    assert ev["replica"] is None, ev
    body = answer.split(b"\r\n\r\n", 1)[1]  # sized (the server's) or chunked (the relay's)
    body = json.loads(body[body.index(b"{") : body.rindex(b"}") + 1])
    assert body["error"]["code"] == code and body["error"]["message"] == ev["error_message"]
    return ev


def test_a_body_past_max_body_bytes_413_is_the_events_status(sidecar: InProcessSidecar) -> None:
    """A body one byte over the sidecar's body limit: 413, and its one event says 413 with
    the same message."""
    rid = request_id()
    answer = exchange(sidecar.port, _post(rid, b"x" * (MAX_BODY + 1)))
    ev = _refused(sidecar, rid, answer, 413)
    assert "exceeds the sidecar's limit" in str(ev["error_message"])


def test_too_many_json_values_413_is_the_events_status(sidecar: InProcessSidecar) -> None:
    """A body under the size limit holding more JSON values than --max-json-elements: 413,
    and its one event says 413."""
    rid = request_id()
    values = json.dumps({"model": "tiny", "pad": [0] * 95_000}).encode()
    assert OFF_LOOP_BYTES < len(values) <= MAX_BODY  # counted before it is parsed
    answer = exchange(sidecar.port, _post(rid, values))
    ev = _refused(sidecar, rid, answer, 413)
    assert "--max-json-elements" in str(ev["error_message"])


def test_too_many_headers_431_is_the_events_status(sidecar: InProcessSidecar) -> None:
    """More headers than max_headers: 431 before the body is read, and the request's one
    event (named by the x-request-id read before the refusal) says 431, request_limit."""
    rid = request_id()
    many = [b"x-h%d: v\r\n" % i for i in range(2 * MAX_HEADERS)]
    answer = exchange(sidecar.port, _post(rid, b"{}", *many))
    ev = _refused(sidecar, rid, answer, 431)
    assert ev["error_class"] == "request_limit" and "too many headers" in str(ev["error_message"])


def test_headers_too_large_431_is_the_events_status(sidecar: InProcessSidecar) -> None:
    """One header value past max_header_bytes (refused as its bytes are read, before the
    value ends): 431, and the request's one event says 431."""
    rid = request_id()
    big = b"x-big: " + b"a" * (2 * MAX_HEADER_BYTES) + b"\r\n"
    answer = exchange(sidecar.port, _post(rid, b"{}", big))
    ev = _refused(sidecar, rid, answer, 431)
    assert "too large" in str(ev["error_message"])


def test_headers_that_stall_408_is_the_events_status(sidecar: InProcessSidecar) -> None:
    """A request line and some headers, then nothing: 408 once the header timeout passes,
    and the request's one event says 408 (header_timeout)."""
    rid = request_id()
    with connect(sidecar.port) as s:
        # httptools hands a header over when the next one begins: host passes the id on.
        s.sendall(
            b"POST %b HTTP/1.1\r\nx-request-id: %b\r\nhost: x\r\n" % (CHAT.encode(), rid.encode())
        )
        answer = read_all(s)
    ev = _refused(sidecar, rid, answer, 408)
    assert "header_timeout" in str(ev["error_message"])


def test_an_upgrade_refused_400_is_the_events_status(sidecar: InProcessSidecar) -> None:
    """A POST asking to switch protocols is refused 400 before the app reads it; its one
    event says 400 (request_limit)."""
    rid = request_id()
    answer = exchange(sidecar.port, _post(rid, b"{}", b"connection: upgrade\r\nupgrade: h2c\r\n"))
    ev = _refused(sidecar, rid, answer, 400)
    assert ev["error_class"] == "request_limit"


def test_a_request_line_too_long_414_writes_no_event_but_is_counted(
    sidecar: InProcessSidecar,
) -> None:
    """A request target past max_request_line: 414 while the request line is still being
    read, so there is no request to record (no event), and request_line counts it."""
    before = len(sidecar.memory.finished)
    hits = _limit_hits(sidecar, "request_line")
    line = b"POST " + CHAT.encode() + b"?" + b"a" * (Limits().max_request_line + 10)
    answer = exchange(sidecar.port, line + b" HTTP/1.1\r\nhost: x\r\n\r\n")
    assert status(answer) == 414
    assert _limit_hits(sidecar, "request_line") == hits + 1
    # The refusal ran no app (the server answered it alone): nothing can still be on its way.
    assert len(sidecar.memory.finished) == before
