"""The finished records in memory, read directly: no file, no flush, no scrape.

As OpenTelemetry's ``InMemorySpanExporter``: ``export`` keeps each record, and a reader
(a test, a notebook, an embedding program) gets them back synchronously. ``event(request_id)``
is the event as the JSONL log would hold it (the same ``Event.to_json``), once its request
has finished; a reader in another thread than the sidecar's event loop waits on a condition,
not a poll. Memory grows with every request: for tests and short runs, not a long-lived
sidecar.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import orjson

from obs.record import Finished


class InMemoryExporter:
    """Keeps every finished record (``finished``), readable at once from any thread."""

    name = "memory"

    def __init__(self) -> None:
        self.finished: list[Finished] = []
        self._by_id: dict[str, list[Finished]] = {}
        self._changed = threading.Condition()

    def export(self, finished: Finished) -> None:
        with self._changed:
            self.finished.append(finished)
            self._by_id.setdefault(finished.event.request_id, []).append(finished)
            self._changed.notify_all()

    def records(self, request_id: str, timeout_s: float = 0.0) -> list[Finished]:
        """The records of ``request_id``, waiting up to ``timeout_s`` for the first."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while request_id not in self._by_id:
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self._changed.wait(left)
            return list(self._by_id[request_id])

    def event(self, request_id: str, timeout_s: float = 15.0) -> dict[str, Any]:
        """The one event of ``request_id`` as JSON reads it; fails unless exactly one came."""
        mine = self.records(request_id, timeout_s)
        assert mine, f"no event for request {request_id}"
        assert len(mine) == 1, f"{len(mine)} events for one request"
        event: dict[str, Any] = orjson.loads(mine[0].event.to_json())
        return event

    def events(self) -> list[dict[str, Any]]:
        """Every event so far, in the order they finished."""
        with self._changed:
            return [orjson.loads(f.event.to_json()) for f in self.finished]

    def clear(self) -> None:
        with self._changed:
            self.finished.clear()
            self._by_id.clear()

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        return True

    def shutdown(self, timeout_s: float = 10.0) -> None:
        return None
