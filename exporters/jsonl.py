"""JSONL event log: one line per request, written by a thread off the event loop.

``export`` serialises the event and appends the line to a bounded deque (never
blocks, takes no lock and wakes no thread; a full deque drops the event and
counts it). A writer thread wakes every ``flush_interval_s`` (0.2 s), or at
once when ``WAKE_LINES`` lines are waiting or on ``force_flush``, and writes
what is waiting with one ``write(2)`` per batch. After a crash, at most the
events of the last flush interval are missing. Files are created owner-only
(0600). Before a line would take the file past ``max_bytes`` it is rotated to
``NAME.1`` (older ones shift to ``.2`` ...; ``backups`` are kept), so no file is
larger (but a single longer line, alone). A write the disk cuts short keeps the
whole lines that fit and is truncated back to the last of them: the file never
holds a torn line. The lines that did not fit are spooled (in memory, at most
``SPOOL_LINES``) and written first at the next flush. An unwritable directory or
a full disk never stops the sidecar: events past the spool are counted as dropped
(reason ``io_error``) and the error logged once per error streak.
The deque, the thread and its batches are ``obs.exporters.batching``'s.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Protocol

import structlog

from obs.exporters.batching import BatchingExporter
from obs.record import Finished

log = structlog.get_logger("vllm_obs.jsonl")

WAKE_LINES = 1024  # this many lines waiting wake the writer before its interval ends
BATCH_LINES = 4096  # most lines per write(2)
SPOOL_LINES = 16384  # lines a failing disk holds back for the next flush; more are dropped


class EventCounters(Protocol):
    def event_written(self, exporter: str, n: int) -> None: ...

    def event_dropped(self, exporter: str, reason: str, n: int) -> None: ...


class JsonlExporter(BatchingExporter[bytes]):
    name = "jsonl"

    def __init__(
        self,
        path: str | Path,
        *,
        counters: EventCounters | None = None,
        max_bytes: int = 256 << 20,
        backups: int = 10,
        queue_size: int = 65536,
        flush_interval_s: float = 0.2,
    ) -> None:
        super().__init__(
            queue_size=queue_size,
            flush_interval_s=flush_interval_s,
            wake_items=WAKE_LINES,
            batch_items=BATCH_LINES,
        )
        self.path = Path(path)
        self._counters = counters
        self._max_bytes = max_bytes
        self._backups = backups
        self._fh: int | None = None
        self._size = 0
        self._failing = False
        self._spool: list[bytes] = []  # lines a failed write left, written first next time
        self._kept = 0  # bytes of whole lines the last failed write left in the file
        self._start()

    def _item(self, finished: Finished) -> bytes:
        return finished.event.to_json()

    def _write_batch(self, items: list[bytes]) -> None:
        spooled, self._spool = self._spool, []
        self._write(spooled + items if spooled else items)

    def _before_batches(self) -> None:
        if self._spool:  # retry what a failed write left, even when nothing new came
            self._write_batch([])

    def _on_stop(self) -> None:
        if self._spool:
            self._write_batch([])
            self._dropped("io_error", len(self._spool))
            self._spool = []
        self._close()

    def _write(self, lines: list[bytes]) -> None:
        written = 0
        self._kept = 0
        try:
            if self._fh is None:
                self._open()
            while written < len(lines):
                end, size = written, 0
                room = self._max_bytes - self._size
                # As many lines as fit; a line longer than the limit goes alone into a new file.
                while end < len(lines):
                    n = len(lines[end])
                    if size + n > room and (end > written or self._size):
                        break
                    size += n
                    end += 1
                if end == written:
                    self._rotate()
                    continue
                self._kept = 0
                self._append(b"".join(lines[written:end]))
                written = end
        except OSError as e:
            self._close()
            written += _whole_lines(lines, written, self._kept)
            rest = lines[written:]
            self._spool = rest[-SPOOL_LINES:]
            if len(rest) > len(self._spool):
                self._dropped("io_error", len(rest) - len(self._spool))
            if not self._failing:
                log.error("event_write_failed", path=str(self.path), error=str(e))
            self._failing = True
            if self._counters is not None and written:
                self._counters.event_written(self.name, written)
            return
        if self._failing:
            log.info("event_write_recovered", path=str(self.path))
            self._failing = False
        if self._counters is not None:
            self._counters.event_written(self.name, len(lines))

    def _append(self, data: bytes) -> None:
        """Write whole lines: a short write (a full disk) keeps the whole lines that fit
        (``_kept`` bytes of them) and cuts the torn one back off."""
        assert self._fh is not None
        before = self._size
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._fh, view)
                view = view[n:]
                self._size += n
        except OSError:
            self._kept = data.rfind(b"\n", 0, self._size - before) + 1
            with contextlib.suppress(OSError):
                os.ftruncate(self._fh, before + self._kept)
            self._size = before + self._kept
            raise

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._size = os.fstat(self._fh).st_size

    def _rotate(self) -> None:
        self._close()
        for i in range(self._backups - 1, 0, -1):
            src = self.path.with_name(f"{self.path.name}.{i}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{i + 1}"))
        if self._backups > 0:
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            os.unlink(self.path)
        self._open()

    def _close(self) -> None:
        if self._fh is not None:
            try:
                os.close(self._fh)
            finally:
                self._fh = None

    def _dropped(self, reason: str, n: int) -> None:
        if self._counters is not None:
            self._counters.event_dropped(self.name, reason, n)


def _whole_lines(lines: list[bytes], start: int, nbytes: int) -> int:
    """How many of ``lines[start:]`` the first ``nbytes`` hold whole."""
    n = 0
    for line in lines[start:]:
        if nbytes < len(line):
            break
        nbytes -= len(line)
        n += 1
    return n
