"""JSONL event log: one line per request, written by a thread off the event loop.

``export`` serialises the event and puts the line on a bounded queue (never
blocks; a full queue drops the event and counts it). A writer thread drains
the queue in batches, writes each batch and flushes it, so after a crash at
most the batch being written is lost (the flush interval is the time one
batch takes, normally well under ``flush_interval_s``). Files are created
owner-only (0600). When the file passes ``max_bytes`` it is rotated to
``NAME.1`` (older ones shift to ``.2`` ...; ``backups`` are kept).
An unwritable directory or a full disk never stops the sidecar: the events
are counted as dropped (reason ``io_error``) and logged once per error streak.
"""

from __future__ import annotations

import os
import queue
import threading
from pathlib import Path
from typing import Protocol

import structlog

from obs.record import Finished

log = structlog.get_logger("vllm_obs.jsonl")

_STOP = b""


class EventCounters(Protocol):
    def event_written(self, exporter: str, n: int) -> None: ...

    def event_dropped(self, exporter: str, reason: str, n: int) -> None: ...


class JsonlExporter:
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
        self.path = Path(path)
        self._counters = counters
        self._max_bytes = max_bytes
        self._backups = backups
        self._flush_interval_s = flush_interval_s
        self._queue: queue.Queue[bytes] = queue.Queue(maxsize=queue_size)
        self._fh: int | None = None
        self._size = 0
        self._failing = False
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(target=self._run, name="vllm-obs-jsonl", daemon=True)
        self._thread.start()

    # Called on the event loop: cheap and non-blocking.
    def export(self, finished: Finished) -> None:
        line = finished.event.to_json()
        try:
            self._idle.clear()
            self._queue.put_nowait(line)
        except queue.Full:
            self._count_dropped("queue_full", 1)

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every queued event has been written (or ``timeout_s`` passes)."""
        if self._queue.empty() and self._idle.is_set():
            return True
        return self._idle.wait(timeout_s) and self._queue.empty()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout_s)

    # Writer thread.
    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=self._flush_interval_s)
            except queue.Empty:
                self._idle.set()
                continue
            batch = [first]
            while len(batch) < 4096:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = _STOP in batch
            lines = [b for b in batch if b]
            if lines:
                self._write(lines)
            if self._queue.empty():
                self._idle.set()
            if stop:
                self._close()
                return

    def _write(self, lines: list[bytes]) -> None:
        data = b"".join(lines)
        try:
            if self._fh is None:
                self._open()
            if self._size and self._size + len(data) > self._max_bytes:
                self._rotate()
            assert self._fh is not None
            view = memoryview(data)
            while view:
                n = os.write(self._fh, view)
                view = view[n:]
            self._size += len(data)
        except OSError as e:
            self._close()
            self._count_dropped("io_error", len(lines))
            if not self._failing:
                log.error("event_write_failed", path=str(self.path), error=str(e))
            self._failing = True
            return
        if self._failing:
            log.info("event_write_recovered", path=str(self.path))
            self._failing = False
        if self._counters is not None:
            self._counters.event_written(self.name, len(lines))

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

    def _count_dropped(self, reason: str, n: int) -> None:
        if self._counters is not None:
            self._counters.event_dropped(self.name, reason, n)
