"""The stream sink alone, against a fake transport: what each pool read does, in microseconds.

``StreamSink.on_body`` runs in the pool socket's callback; here a fake pool response and a
fake client connection stand in for the two sockets (the sink only calls their methods),
so the timing of each read, the writes, flow control and the abort policy are pinned
without a server. The same paths end to end: test_inproc_streaming.py, test_inproc_relay.py.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from obs.config import SlowClient
from obs.sidecar.relay.request import MAX_GAPS, Request
from obs.sidecar.relay.streaming import StreamSink
from tests.support.probes import CHAT, DONE_FRAME
from tests.support.scripted_upstream import token_frame


class FakeResponse:
    """The pool's response as the sink sees it: when the current read arrived, whether it is
    the body's last piece, pause, close."""

    def __init__(self) -> None:
        self.read_ns = 0
        self.ending = False
        self.paused = self.closed = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def close(self) -> None:
        self.closed = True


class FakeConn:
    """The client's connection: what was written, whether it is behind, what it holds."""

    def __init__(self, behind_after: int | None = None, held: int = 0) -> None:
        self.written: list[bytes] = []
        self.behind_after = behind_after  # writes after which the client is behind
        self.held = held
        self.left = False
        self.waiter: asyncio.Future[None] | None = None
        self.end_in_hand = False

    def body_in_hand(self) -> None:
        self.end_in_hand = True

    def writable(self) -> asyncio.Future[None]:
        self.waiter = asyncio.get_running_loop().create_future()
        return self.waiter

    def write_body(self, data: bytes) -> None:
        self.written.append(data)

    @property
    def paused(self) -> bool:
        return self.behind_after is not None and len(self.written) >= self.behind_after

    def buffered(self) -> int:
        return self.held


class FakeDeadline:
    def __init__(self) -> None:
        self.last_ns = 0
        self.first_ns = 0
        self.sending = False

    def first_output(self, now_ns: int) -> None:
        self.first_ns = self.last_ns = now_ns


def _sink(
    conn: FakeConn, policy: str = "wait", limit: int = 1 << 20
) -> tuple[StreamSink, Request, FakeResponse, FakeDeadline]:
    req, resp, deadline = Request(CHAT), FakeResponse(), FakeDeadline()
    slow = SlowClient(buffer_bytes=limit, policy=policy)  # type: ignore[arg-type]
    sink = StreamSink(req, cast(Any, resp), False, cast(Any, conn), slow, cast(Any, deadline))
    return sink, req, resp, deadline


def _read(sink: StreamSink, resp: FakeResponse, at_ns: int, *frames: bytes) -> None:
    resp.read_ns = at_ns
    sink.on_body(b"".join(frames))


def test_each_read_is_one_write_and_one_gap() -> None:
    """Two frames in one read go out in one write and give no gap; the next read gives one
    gap from the read before; [DONE] marks the stream delivered."""
    conn = FakeConn()
    sink, req, resp, deadline = _sink(conn)
    _read(sink, resp, 1_000, token_frame("a"), token_frame("b"))
    _read(sink, resp, 5_000, token_frame("c"))
    assert len(conn.written) == 2 and conn.written[0] == token_frame("a") + token_frame("b")
    assert list(req.itl) == [4_000]
    assert (req.clock.first_up, deadline.first_ns, deadline.last_ns) == (1_000, 1_000, 5_000)
    assert (sink.first_read, sink.burst) == (2, 2)
    assert not req.delivered
    _read(sink, resp, 6_000, DONE_FRAME)
    assert req.delivered and conn.written[-1] == DONE_FRAME


def test_a_stream_keeps_its_first_gaps_only() -> None:
    """An endless stream keeps ``MAX_GAPS`` inter-token gaps, the first ones, and goes on."""
    conn = FakeConn()
    sink, req, resp, _ = _sink(conn)
    frame = token_frame("a")
    for i in range(MAX_GAPS + 5):
        _read(sink, resp, 1_000 * (i + 1), frame)
    assert len(req.itl) == MAX_GAPS and set(req.itl) == {1_000}
    assert len(conn.written) == MAX_GAPS + 5 and sink.state.tokens == MAX_GAPS + 5


def test_a_client_behind_pauses_the_pool_until_it_reads() -> None:
    """Under ``wait``, a client past its buffer pauses reading from the pool and the deadline
    waits on the client; once it can take more (``conn.writable()`` is done), reading resumes
    and the wait is counted."""

    async def scenario() -> None:
        conn = FakeConn(behind_after=1)
        sink, _, resp, deadline = _sink(conn)
        _read(sink, resp, 1_000, token_frame("a"))
        assert resp.paused and deadline.sending and conn.waiter is not None
        assert sink.waiting is conn.waiter
        conn.behind_after = None
        conn.waiter.set_result(None)
        await asyncio.sleep(0)  # the future's callback runs on the loop's next turn
        assert not resp.paused and not deadline.sending and sink.waiting is None
        assert sink.blocked > 0

    asyncio.run(scenario())


def test_a_client_that_left_while_behind_is_not_resumed() -> None:
    """A client that leaves while the pool is paused for it completes ``writable()`` too
    (its connection is gone): the pool stays paused, and the stream's end counts the wait."""

    async def scenario() -> None:
        conn = FakeConn(behind_after=1)
        sink, _, resp, deadline = _sink(conn)
        _read(sink, resp, 1_000, token_frame("a"))
        assert conn.waiter is not None
        conn.left = True
        conn.waiter.set_result(None)
        await asyncio.sleep(0)
        assert resp.paused and deadline.sending and sink.paused_at and not sink.blocked
        sink.stop_waiting()
        sink.resumed()
        assert not resp.paused and sink.blocked > 0

    asyncio.run(scenario())


def test_the_abort_policy_ends_the_stream_past_the_bound() -> None:
    """Under ``abort``, a client holding more than the bound unread: the pool's response is
    closed and nothing more is written."""
    conn = FakeConn(held=2048)
    sink, _, resp, _ = _sink(conn, policy="abort", limit=1024)
    _read(sink, resp, 1_000, token_frame("a"))
    assert sink.aborted and resp.closed and conn.written == []


def test_the_pools_last_piece_waits_for_the_end_of_the_response() -> None:
    """A read that ends the pool's body and carries [DONE] is not written on its own: it goes
    out with the response's end (one write, the head too if it waits: the connection is
    told), and the stream counts as delivered."""
    conn = FakeConn()
    sink, req, resp, _ = _sink(conn)
    _read(sink, resp, 1_000, token_frame("a"))
    assert not conn.end_in_hand
    resp.ending = True
    _read(sink, resp, 2_000, token_frame("b"), DONE_FRAME)
    assert conn.written == [token_frame("a")]
    assert sink.last == token_frame("b") + DONE_FRAME and req.delivered and conn.end_in_hand
