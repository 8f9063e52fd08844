"""Reading a sidecar's JSONL event log as it grows (a subprocess's or an in-process one's)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Protocol

import orjson


class WritesEvents(Protocol):
    """A sidecar writing its events to a JSONL file (``SidecarProcess``, ``InProcessSidecar``)."""

    @property
    def events_path(self) -> Path | None: ...


class EventLog:
    """Reads a sidecar's event log as it grows, keeping every event by request id."""

    def __init__(self, sc: WritesEvents) -> None:
        assert sc.events_path is not None
        self.path = sc.events_path
        self.offset = 0
        self.events: list[dict[str, Any]] = []

    def _read(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        whole = data[: data.rfind(b"\n") + 1]
        self.offset += len(whole)
        self.events += [orjson.loads(line) for line in whole.splitlines() if line.strip()]

    def wait(self, n: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """Every event once there are at least ``n`` (or the timeout passed)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._read()
            if len(self.events) >= n or time.monotonic() > deadline:
                return self.events
            time.sleep(0.005)

    def one(self, request_id: str, timeout_s: float = 15.0) -> dict[str, Any]:
        """The event of ``request_id``; fails unless exactly one is written."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._read()
            mine = [e for e in self.events[-50:] if e["request_id"] == request_id]
            if mine or time.monotonic() > deadline:
                break
            time.sleep(0.005)
        assert mine, f"no event for request {request_id}"
        time.sleep(0.01)
        self._read()
        mine = [e for e in self.events[-50:] if e["request_id"] == request_id]
        assert len(mine) == 1, f"{len(mine)} events for one request"
        return mine[0]
