"""A client's next request on a kept-alive connection, and the record of the one before.

A client that sends its next request as soon as it has read a stream's end carries, in that
request, the acknowledgement the stream's record waits for; the sidecar serves that request
first when it is relayed (its record goes on a loop turn later, ``NextTurn``). What the
client can observe keeps its order: a ``/metrics`` scrape sent next on that connection counts
every stream before it, and the events come in the order the requests ended.

The client is a raw socket that does not ask for quick acknowledgements (as ``vllm bench
serve``'s): on a reused connection Linux delays its ACK onto the next request. The pool is
``ScriptedUpstream`` (a fake, in this process): the test knows what it streams.
"""

from __future__ import annotations

import socket

import orjson
import pytest

from obs import conventions as c
from obs.prom.api import parse_samples, sample_sum
from tests.sidecar.conftest import InprocFactory
from tests.support import chat_body
from tests.support.inproc import InProcessSidecar, lane_config, request_id
from tests.support.probes import CHAT, DONE_FRAME
from tests.support.rawhttp import connect, read_response
from tests.support.scripted_upstream import Script, ScriptedUpstream, token_frame, usage_frame

STREAMS = 4


@pytest.fixture(scope="module")
def sidecar(scripted: ScriptedUpstream, inproc: InprocFactory) -> InProcessSidecar:
    """An in-process sidecar with one lane on the scripted pool."""
    return inproc(lane_config({"main": [scripted.url]}))


def _stream(scripted: ScriptedUpstream) -> tuple[str, bytes]:
    rid = request_id()
    pieces = [token_frame("a"), token_frame("b"), usage_frame(3, 2), DONE_FRAME]
    scripted.scripts[rid] = Script(pieces=pieces, gap_s=0)
    body = orjson.dumps(chat_body(rid, stream=True))
    head = b"POST %b HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n" % CHAT.encode()
    head += b"x-request-id: %b\r\ncontent-length: %d\r\n\r\n" % (rid.encode(), len(body))
    return rid, head + body


def _read_stream(s: socket.socket) -> bytes:
    """One chunked response, read to its last chunk."""
    data = b""
    while not data.endswith(b"\r\n0\r\n\r\n"):
        piece = s.recv(65536)
        assert piece, f"closed after {data!r}"
        data += piece
    return data


def _finished(sidecar: InProcessSidecar, samples: str) -> float:
    return sample_sum(parse_samples(samples), c.REQUESTS.name + "_total", lane="main")


def test_a_scrape_sent_next_counts_every_stream_before_it_in_order(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """Streams sent back to back on one connection, then /metrics on it: the scrape counts
    them all, and their events come in the order the requests were sent."""
    before = _finished(sidecar, sidecar.metrics())
    rids = []
    with connect(sidecar.port) as s:
        for _ in range(STREAMS):
            rid, request = _stream(scripted)
            rids.append(rid)
            s.sendall(request)
            assert b"data: [DONE]" in _read_stream(s)
        s.sendall(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        scraped = read_response(s).decode()
    assert _finished(sidecar, scraped) - before == STREAMS
    order = [ev["request_id"] for ev in sidecar.memory.events() if ev["request_id"] in rids]
    assert order == rids
    assert all(sidecar.event(rid)["status"] == c.OK for rid in rids)
