"""A bounded on-disk spool of ``JSONEachRow`` lines waiting for their store to come back.

The ClickHouse exporter appends a batch here when an insert fails, and sends
the spool's contents first (oldest first, in chunks) once inserts succeed
again. The file is created owner-only (0600). ``append`` keeps the lines that fit
under ``max_bytes``; the caller counts the rest as dropped. Lines sent are
remembered by offset; when the whole file has been sent
it is truncated. A process that dies mid-drain re-sends from the start after a
restart: the event table collapses such duplicates (``ReplacingMergeTree``).
A line cut short by a crash mid-append is cut off when the spool is opened.
Only the exporter's thread touches a spool.
"""

from __future__ import annotations

import os
from pathlib import Path


class Spool:
    def __init__(self, path: str | Path, max_bytes: int) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._sent = 0  # bytes at the head of the file already delivered
        self._size = self.path.stat().st_size if self.path.exists() else 0
        if self._size:
            self._drop_partial_tail()

    def _drop_partial_tail(self) -> None:
        """A process killed mid-append leaves a last line without its newline: cut it off
        (it was never counted as spooled), so ClickHouse never sees half a row."""
        with open(self.path, "r+b") as f:
            f.seek(self._size - 1)
            if f.read(1) == b"\n":
                return
            pos = self._size
            while pos > 0:
                step = min(1 << 16, pos)
                f.seek(pos - step)
                chunk = f.read(step)
                nl = chunk.rfind(b"\n")
                if nl >= 0:
                    pos = pos - step + nl + 1
                    break
                pos -= step
            f.truncate(pos)
        self._size = pos

    @property
    def pending_bytes(self) -> int:
        return self._size - self._sent

    def __bool__(self) -> bool:
        return self.pending_bytes > 0

    def append(self, lines: list[bytes]) -> int:
        """Append the lines that fit under ``max_bytes`` (oldest first); return how many."""
        room = self.max_bytes - self._size
        n = 0
        for line in lines:
            if len(line) > room:
                break
            room -= len(line)
            n += 1
        if not n:
            return 0
        data = b"".join(lines[:n])
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        self._size += len(data)
        return n

    def peek(self, max_bytes: int) -> tuple[bytes, int]:
        """The next chunk of whole lines (at most ``max_bytes``, at least one line), and its
        line count."""
        with open(self.path, "rb") as f:
            f.seek(self._sent)
            data = f.read(max_bytes)
            if len(data) == max_bytes and not data.endswith(b"\n"):
                cut = data.rfind(b"\n")
                if cut >= 0:
                    data = data[: cut + 1]
                else:  # one line longer than max_bytes: read it whole
                    data += f.readline()
        return data, data.count(b"\n")

    def consume(self, nbytes: int) -> None:
        """Mark ``nbytes`` from the head as delivered; empty the file once all are."""
        self._sent += nbytes
        if self._sent >= self._size:
            with open(self.path, "wb"):
                pass
            self._sent = self._size = 0
