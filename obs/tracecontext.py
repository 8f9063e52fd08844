"""W3C Trace Context (``traceparent``) parsing and formatting, without OpenTelemetry.

The relay needs trace and span ids before the request is dispatched (to
inject ``traceparent`` upstream) but builds its spans only when the request
has ended, off the relay path; so ids are made here, cheaply.
"""

from __future__ import annotations

import os
import re
import struct
from array import array
from dataclasses import dataclass

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


class _Ids:
    """64-bit ids from the kernel's CSPRNG (``os.urandom``, as ``secrets`` uses), drawn 512
    at a time: a syscall per hundreds of requests, not per id. The sidecar's span id is what
    keeps a forged engine span out of its trace (docs/security.md), so ids must not be
    predictable: the ``random`` module's Mersenne Twister gives its state away in 624 outputs.
    ``list.pop`` is atomic, so two threads (the relay's loop, an exporter's) never take the
    same id; a forked child forgets the parent's, so no two processes hand out the same."""

    BATCH = 512

    def __init__(self) -> None:
        self._left: list[int] = []

    def next(self) -> int:
        try:
            return self._left.pop()
        except IndexError:
            self._left.extend(array("Q", os.urandom(8 * self.BATCH)))
            return self._left.pop()

    def forget(self) -> None:
        self._left.clear()


_IDS = _Ids()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_IDS.forget)


def new_request_id() -> str:
    """A request id when the client sent none: 64 unpredictable bits in hex, as vLLM's."""
    return f"{_IDS.next():016x}"


@dataclass(frozen=True, slots=True)
class TraceIds:
    """The ids of one request's root span, and its parent's span id if the client sent one."""

    trace_id: int
    span_id: int
    parent_span_id: int | None
    sampled: bool

    def traceparent(self) -> str:
        """The ``traceparent`` to send upstream: the pool's span becomes our root's child."""
        flags = "01" if self.sampled else "00"
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{flags}"

    @property
    def trace_id_hex(self) -> str:
        return f"{self.trace_id:032x}"

    @property
    def span_id_hex(self) -> str:
        return f"{self.span_id:016x}"


def new_span_id(owner: tuple[int, int] | None = None) -> int:
    """An unpredictable span id; with ``owner`` (index, count) one that ``owner_of`` maps to
    ``index``: the worker that made it (``--workers``: obs.sidecar.server.workers)."""
    sid = _IDS.next() or 1
    if owner is None or owner[1] <= 1:
        return sid
    index, count = owner
    sid -= sid % count
    return sid + index if sid + index else count


_ZERO_ID = bytes(8)


def new_span_ids(count: int) -> bytes:
    """``count`` unpredictable span ids, 8 big-endian bytes each, none of them zero."""
    while True:
        ids = struct.pack(f">{count}Q", *[_IDS.next() for _ in range(count)])
        if _ZERO_ID not in ids:  # (a zero run across two ids, as rare, draws again too)
            return ids


def owner_of(span_id: str, count: int) -> int:
    """The worker (of ``count``) whose span id this is (``new_span_id(owner)``); 0 for an id
    that is not hex."""
    try:
        return int(span_id, 16) % count
    except ValueError:
        return 0


def new_ids(traceparent: str | None, owner: tuple[int, int] | None = None) -> TraceIds:
    """Continue the client's trace when its ``traceparent`` is valid, else start one; the span
    id is ``owner``'s (``new_span_id``)."""
    if traceparent:
        m = _TRACEPARENT.match(traceparent.strip().lower())
        if m and int(m.group(1), 16) and int(m.group(2), 16):
            return TraceIds(
                trace_id=int(m.group(1), 16),
                span_id=new_span_id(owner),
                parent_span_id=int(m.group(2), 16),
                sampled=bool(int(m.group(3), 16) & 1),
            )
    return TraceIds((_IDS.next() << 64 | _IDS.next()) or 1, new_span_id(owner), None, True)
