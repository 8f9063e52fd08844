"""What a connection read and has not parsed yet: parsed a piece at a time, never a read at once.

``Intake`` keeps the bytes read from one client socket that its parser has not taken and
hands them to the parser a piece at a time (the connection says how big: ``PIECE``, or up
to the end of a sized body), stopping while the connection holds parsing (a pipelined
request waits for its turn, a body waits for the app). While it keeps bytes, reading from
the socket is paused: the kernel's buffers hold the rest. So a connection holds at most one
read and a piece's worth of parsed requests, whatever the client writes (6,000 pipelined
requests in one write are parsed as the earlier ones are answered). Bytes the parser gives
back (what follows a plain GET's ``Upgrade``) go to the front and are parsed by the same
loop, never by recursion.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

PIECE = 4096  # bytes parsed at a time outside a sized body
BODY_PIECE = 256 << 10  # at most this much of a sized body at a time


class Intake:
    """One connection's unparsed bytes (see the module's doc)."""

    __slots__ = ("_buf", "_feed", "_parsing", "_paused", "_size", "held", "transport")

    def __init__(self, feed: Callable[[bytes], None], size: Callable[[], int]) -> None:
        self._feed = feed  # the parser's: one piece
        self._size = size  # how many bytes the next piece may hold
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self.held = False  # the connection holds parsing
        self._parsing = False
        self._paused = False  # reading from the socket is paused

    def received(self, data: bytes) -> None:
        self._buf += data
        self.parse()

    def unread(self, data: bytes) -> None:
        """Bytes the parser gave back: parsed next."""
        self._buf[:0] = data

    def hold(self) -> None:
        """Parsing waits (and reading from the socket) until ``release``."""
        self.held = True
        self._pause()

    def release(self) -> None:
        self.held = False
        self.parse()

    def clear(self) -> None:
        self._buf.clear()

    def parse(self) -> None:
        """Parse kept bytes a piece at a time until they run out or parsing is held."""
        t = self.transport
        if self._parsing or t is None:
            return
        self._parsing = True
        try:
            while self._buf and not self.held and not t.is_closing():
                size = self._size()
                piece = bytes(self._buf[:size])
                del self._buf[:size]
                self._feed(piece)
        finally:
            self._parsing = False
        if self._buf:
            self._pause()  # one read's worth waits here; the socket keeps the rest
        elif not self.held:
            self._resume()

    def _pause(self) -> None:
        t = self.transport
        if t is not None and not self._paused and not t.is_closing():
            self._paused = True
            t.pause_reading()

    def _resume(self) -> None:
        t = self.transport
        if t is not None and self._paused and not t.is_closing():
            self._paused = False
            t.resume_reading()
