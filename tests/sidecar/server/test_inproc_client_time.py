"""What the client lived, on real sockets: its upload and its reading are its own time.

Raw-socket clients with a 4 KiB receive buffer (set before ``connect``) read streams at a
set pace on each connection kind (kept alive, ``Connection: close``, HTTP/1.0): the event's
stream phase ends when the client's side has acknowledged the last byte, or says how many
bytes it had not when the record stopped waiting. A body sent slowly is the client's upload,
apart from the server's clock.

The pool is ``ScriptedUpstream`` (a fake, in this process): it answers at once, so every
second the record shows is the client's; the engine plays no part in what is measured here.
"""

from __future__ import annotations

import itertools
import socket
import struct
import threading
import time
from typing import Any

import orjson
import pytest

from obs import conventions as c
from obs.config import parse_config
from tests.sidecar.conftest import InprocFactory
from tests.support import chat_body
from tests.support.inproc import InProcessSidecar, lane_config, request_id
from tests.support.probes import CHAT, DONE_FRAME
from tests.support.scripted_upstream import Script, ScriptedUpstream, token_frame, usage_frame
from tests.support.small_window import KINDS, raw_post, read_paced, small_socket

pytestmark = pytest.mark.inproc

FRAMES = 160  # of ~420 bytes: a ~67 KB stream, far more than the client's window
RATE = 12_000  # bytes/s the slow clients read: about 5.6 s for the stream
STOPPED_WAIT_S = 1.0  # record_wait_s of the lane whose clients stop reading


def _script(rid: str, frames: int = FRAMES) -> Script:
    pieces = [token_frame(f"{i:04d} " + "x" * 300) for i in range(frames)]
    return Script(pieces=[*pieces, usage_frame(5, frames), DONE_FRAME], gap_s=0)


@pytest.fixture(scope="module")
def sidecar(scripted: ScriptedUpstream, inproc: InprocFactory) -> InProcessSidecar:
    """The default slow-client settings (the record waits up to 30 s for the last byte)."""
    return inproc(lane_config({"main": [scripted.url]}))


@pytest.fixture(scope="module")
def impatient(scripted: ScriptedUpstream, inproc: InprocFactory) -> InProcessSidecar:
    """A lane whose record waits ``STOPPED_WAIT_S`` for the client's side."""
    slow = {"slow_client": {"record_wait_s": STOPPED_WAIT_S}}
    return inproc(lane_config({"main": [scripted.url]}, admission=slow))


def _send(
    scripted: ScriptedUpstream,
    port: int,
    kind: str,
    headers: dict[str, str] | None = None,
    frames: int = FRAMES,
) -> tuple[str, socket.socket, float]:
    """Script a stream, connect with a small window, send the request: (id, socket, t0)."""
    rid = request_id()
    scripted.scripts[rid] = _script(rid, frames)
    body = orjson.dumps(chat_body(rid, stream=True))
    sock = small_socket(port)
    t0 = time.monotonic()
    sock.sendall(raw_post(CHAT, body, kind, {"x-request-id": rid, **(headers or {})}))
    return rid, sock, t0


def _read_slowly(scripted: ScriptedUpstream, port: int, kind: str, out: dict[str, Any]) -> None:
    rid, sock, t0 = _send(scripted, port, kind, frames=FRAMES // 2)
    with sock:
        data, t_end = read_paced(sock, kind, RATE)
    out[kind] = (rid, data, t_end - t0)


def test_slow_reader_recorded_to_its_last_byte_on_every_connection_kind(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A client reading ~12 KB/s (a ~34 KB stream) through a 4 KiB window: kept alive,
    Connection: close or HTTP/1.0, the event's e2e is within 20% of the client's own time,
    and its stream phase holds the client's reading (the pool answered at once)."""
    got: dict[str, Any] = {}
    threads = [
        threading.Thread(target=_read_slowly, args=(scripted, sidecar.port, kind, got))
        for kind in KINDS
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(got) == set(KINDS)
    for kind in KINDS:
        rid, data, client_s = got[kind]
        assert data.rstrip(b"\r\n0").endswith(DONE_FRAME.rstrip()), kind
        ev = sidecar.event(rid)
        assert ev["status"] == c.OK, (kind, ev)
        assert ev["client_unread_bytes"] is None, (kind, ev)
        e2e_s = ev["e2e_ms"] / 1000
        assert 0.8 * client_s <= e2e_s <= 1.05 * client_s, (kind, e2e_s, client_s)
        assert ev["stream_ms"] >= 0.7 * ev["e2e_ms"], (kind, ev)  # the client's, not decode
        assert ev["decode_ms"] < 0.2 * ev["e2e_ms"], (kind, ev)


def test_a_slow_readers_time_is_its_stream_phase_not_the_pools_cadence(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """The same paced stream (a frame every 10 ms) read slowly and at once: the slow reader's
    extra time is all stream phase; its TPOT and ITL are the pool's cadence, as the fast one's."""
    got = {}
    for rate in (RATE, 1e12):
        rid = request_id()
        frames = [token_frame(f"{i:04d} " + "x" * 300) for i in range(60)]
        scripted.scripts[rid] = Script(pieces=[*frames, usage_frame(5, 60), DONE_FRAME], gap_s=0.01)
        body = orjson.dumps(chat_body(rid, stream=True))
        with small_socket(sidecar.port) as sock:
            sock.sendall(raw_post(CHAT, body, "close", {"x-request-id": rid}))
            read_paced(sock, "close", rate, chunk=512 if rate == RATE else 65536)
        got[rate] = sidecar.event(rid)
    slow, fast = got[RATE], got[1e12]
    assert slow["stream_ms"] > 1000 > fast["stream_ms"]
    assert slow["decode_ms"] < 3 * fast["decode_ms"] + 100
    assert slow["tpot_ms"] is not None and fast["tpot_ms"] is not None
    assert slow["tpot_ms"] < 3 * fast["tpot_ms"] + 5
    assert slow["itl_p50_ms"] < 3 * fast["itl_p50_ms"] + 5


def test_a_fast_reader_on_each_kind_is_answered_and_closed_as_asked(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A client that reads at once gets the whole stream on every connection kind; with
    Connection: close and HTTP/1.0 the sidecar closes the connection after the last byte,
    and a kept-alive connection takes a second request."""
    for kind in KINDS:
        rid, sock, _ = _send(scripted, sidecar.port, kind)
        with sock:
            data, _ = read_paced(sock, kind, 1e12, chunk=65536)
            assert data.endswith(DONE_FRAME if kind == "http/1.0" else b"\r\n0\r\n\r\n")
            if kind == "keep-alive":  # the same connection serves the next request
                rid2 = request_id()
                scripted.scripts[rid2] = _script(rid2, 3)
                body = orjson.dumps(chat_body(rid2, stream=True))
                sock.sendall(raw_post(CHAT, body, kind, {"x-request-id": rid2}))
                again, _ = read_paced(sock, kind, 1e12, chunk=65536)
                assert b"200 OK" in again
                assert sidecar.event(rid2)["status"] == c.OK
        ev = sidecar.event(rid)
        assert (ev["status"], ev["client_unread_bytes"]) == (c.OK, None), kind


@pytest.mark.parametrize("kind", KINDS)
def test_a_client_that_stops_reading_is_recorded_with_what_it_had_not_taken(
    scripted: ScriptedUpstream, impatient: InProcessSidecar, kind: str
) -> None:
    """A client that reads the head and stops: after the lane's record_wait_s the event is
    written while the client still holds the connection, `ok`, with client_unread_bytes > 0
    and the stream phase so far: at least the wait (how much more is the machine's)."""
    rid, sock, _ = _send(scripted, impatient.port, kind)
    with sock:
        assert b"200 OK" in sock.recv(256)
        ev = impatient.event(rid)  # written while the client still holds the connection
    assert ev["status"] == c.OK
    assert ev["client_unread_bytes"] > 0
    assert ev["stream_ms"] >= STOPPED_WAIT_S * 1000 * 0.9


def test_a_client_that_resets_before_taking_the_end_left_before_the_end(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A client that reads a little, then resets the connection while the sidecar waits for
    it to take the rest: client_disconnect in the stream phase, with the bytes it never took."""
    rid, sock, _ = _send(scripted, sidecar.port, "close")
    assert b"200 OK" in sock.recv(256)
    time.sleep(0.5)  # the pool has finished: the sidecar waits on the client
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # a reset
    ev = sidecar.event(rid)
    assert (ev["status"], ev["error_phase"]) == (c.DISCONNECTED, "stream")
    assert ev["client_unread_bytes"] > 0


def test_a_client_that_resets_right_after_the_end_read_it_all(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A fast client that resets its connection as soon as it has read [DONE] (as SDKs that
    close at once may) received the whole answer: `ok`, nothing unread."""
    for _ in range(5):
        rid, sock, _ = _send(scripted, sidecar.port, "keep-alive")
        data = b""
        while not data.endswith(DONE_FRAME) and b"\r\n0\r\n" not in data[-16:]:
            data += sock.recv(65536)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        ev = sidecar.event(rid)
        assert (ev["status"], ev["client_unread_bytes"]) == (c.OK, None)


def test_slow_upload_is_the_clients_time(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A body sent over 1.5 s to a pool that answers at once: the 1.5 s is upload_ms, in no
    phase and not in e2e; TTFT and the queue phase start when the body is complete, so each is
    shorter than the upload the same request measured."""
    rid = request_id()
    scripted.scripts[rid] = _script(rid, 3)
    body = orjson.dumps(chat_body(rid, stream=True))
    request = raw_post(CHAT, body, "close", {"x-request-id": rid})
    head, rest = request.split(b"\r\n\r\n", 1)
    pieces = [rest[i : i + max(1, len(rest) // 6)] for i in range(0, len(rest), len(rest) // 6)]
    with small_socket(sidecar.port, rcvbuf=None) as sock:
        sock.sendall(head + b"\r\n\r\n")
        for piece in pieces:
            time.sleep(1.5 / len(pieces))
            sock.sendall(piece)
        data, _ = read_paced(sock, "close", 1e12, chunk=65536)
    assert data.endswith(b"\r\n0\r\n\r\n")
    ev = sidecar.event(rid)
    assert ev["status"] == c.OK
    assert ev["upload_ms"] >= 1400
    assert ev["queue_ms"] <= ev["ttft_ms"] <= ev["e2e_ms"] < ev["upload_ms"]


def test_one_connection_per_request_slow_reader_is_learned(
    scripted: ScriptedUpstream, inproc: InprocFactory
) -> None:
    """A client without class headers that opens one connection per request (Connection:
    close) and reads slowly is learned from its first stream: its second goes to the slow
    lane, as learned; a fast client of the same sidecar stays in the default lane. (Streams of
    ~17 KB, about 1.4 s at the slow pace, against a 300 ms slow_stream_ms.)"""
    config = parse_config(
        {
            "pools": [{"name": "p", "replicas": [scripted.url]}],
            "lanes": [
                {"name": "slow", "pool": "p", "match": [{"slow_reader": True, "stream": True}]},
                {"name": "main", "pool": "p"},
            ],
            "default_lane": "main",
            "recognition": {"client_id": "api_key", "slow_stream_ms": 300},
        },
        "<inproc>",
    )
    sc = inproc(config)
    lanes: dict[str, list[tuple[str, str]]] = {"slow": [], "fast": []}
    for who, rate in (("slow", RATE), ("fast", 1e12), ("slow", RATE), ("fast", 1e12)):
        auth = {"authorization": f"Bearer sk-{who}"}
        rid, sock, _ = _send(scripted, sc.port, "close", auth, frames=FRAMES // 4)
        with sock:
            read_paced(sock, "close", rate, chunk=512 if rate == RATE else 65536)
        ev = sc.event(rid)
        lanes[who].append((ev["lane"], ev["class_source"]))
    assert lanes["slow"] == [("main", "default"), ("slow", "learned")]
    assert lanes["fast"] == [("main", "default"), ("main", "default")]


def test_next_request_on_the_connection_dates_the_previous_streams_end(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A kept-alive client's next request carries its ACK of the previous stream: that stream's
    end is the read of those bytes, not when its handler woke after it (the next request's
    handler runs first: obs.sidecar.server.connection ``data_received``)."""
    sock = small_socket(sidecar.port, rcvbuf=None)  # a fast reader on one connection
    rids = []
    with sock:  # 16 in a row: on a starved machine a client's ACK can go out before its request
        for _ in range(16):
            rid = request_id()
            scripted.scripts[rid] = _script(rid, frames=4)
            body = orjson.dumps(chat_body(rid, stream=True))
            sock.sendall(raw_post(CHAT, body, "keep-alive", {"x-request-id": rid}))
            read_paced(sock, "keep-alive", 1e9, chunk=65536)  # whole, at once
            rids.append(rid)
    records = [sidecar.memory.records(rid, timeout_s=10)[0] for rid in rids]
    pairs = list(itertools.pairwise(records))
    # Its end is never after the next request's first read; in ping-pong the client holds its
    # ACK until that request (the first ones on a connection are acknowledged at once).
    assert all(prev.clock.end <= nxt.clock.received for prev, nxt in pairs)
    assert any(prev.clock.end == nxt.clock.received for prev, nxt in pairs)
