"""How ``Exchange`` cuts a response into writes: the head goes out with the body's first piece
when that piece comes before the loop's next turn, else alone on that turn, unless the whole
body is in hand (``head_with_end``): then head, body and end are one write.

The transport is a recorder (a fake): a real socket merges writes, so the number of writes,
which is what this pins, cannot be read from the client's side.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from obs.sidecar.server.wire import Clock, Exchange, Flow, http_scope


class Recorder:
    """A transport that keeps each write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


def _exchange(transport: Recorder) -> Exchange:
    scope = http_scope(b"POST", "1.1", b"/v1/chat/completions", [], None, None)
    ex = Exchange(
        scope,
        cast(Any, transport),
        Flow(),
        Clock(),
        keep_alive=True,
        on_complete=lambda _: None,
        resume_reading=lambda: None,
    )
    ex.body_complete()
    return ex


def test_the_head_and_a_first_piece_that_is_ready_are_one_write() -> None:
    """A chunked head followed at once by a piece and the end: two writes, the first
    holding the head and the piece, the second the last piece and the end."""
    t = Recorder()

    async def main() -> None:
        ex = _exchange(t)
        ex.start(200, [(b"content-type", b"text/event-stream")])
        ex.write(b"data: 1\n\n")
        ex.end(b"data: [DONE]\n\n")
        await asyncio.sleep(0)  # the head's own turn comes: nothing is left to write

    asyncio.run(main())
    assert len(t.writes) == 2
    head, _, first = t.writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"transfer-encoding: chunked" in head
    assert first == b"9\r\ndata: 1\n\n\r\n"
    assert t.writes[1] == b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"


def test_a_head_with_no_body_yet_goes_out_on_the_next_turn() -> None:
    """A head whose body is not ready is written alone on the loop's next turn: the client
    never waits for the first token to see the head."""
    t = Recorder()

    async def main() -> list[bytes]:
        ex = _exchange(t)
        ex.start(200, [(b"content-type", b"text/event-stream")])
        before = list(t.writes)
        await asyncio.sleep(0)
        ex.write(b"data: 1\n\n")
        return before

    assert asyncio.run(main()) == []
    assert len(t.writes) == 2 and t.writes[0].endswith(b"\r\n\r\n")
    assert t.writes[1] == b"9\r\ndata: 1\n\n\r\n"


def test_a_head_whose_whole_body_is_in_hand_goes_with_the_end() -> None:
    """A short answer whose whole body came in the pool's first read: the head does not go
    alone on the next turn; head, last piece and the chunked end are one write."""
    t = Recorder()

    async def main() -> None:
        ex = _exchange(t)
        ex.start(200, [(b"content-type", b"text/event-stream")])
        ex.head_with_end()
        await asyncio.sleep(0)  # the head's turn passes (the relay's task wakes after it)
        await asyncio.sleep(0)
        assert t.writes == []
        ex.end(b"data: 1\n\ndata: [DONE]\n\n")

    asyncio.run(main())
    assert len(t.writes) == 1
    head, _, rest = t.writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"transfer-encoding: chunked" in head
    assert rest == b"17\r\ndata: 1\n\ndata: [DONE]\n\n\r\n0\r\n\r\n"
