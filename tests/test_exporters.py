"""The exporter fan-out: one failing exporter never stops the others, and is counted."""

from __future__ import annotations

from obs.events import Event
from obs.exporters.base import Fanout
from obs.phases import Clock
from obs.record import Finished
from obs.tracecontext import new_ids


class Broken:
    name = "broken"

    def export(self, finished: Finished) -> None:
        raise OSError("disk on fire")

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        raise OSError("still on fire")

    def shutdown(self, timeout_s: float = 10.0) -> None:
        return None


class Keeper:
    name = "keeper"

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.shut = False

    def export(self, finished: Finished) -> None:
        self.seen.append(finished.event.request_id)

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        return True

    def shutdown(self, timeout_s: float = 10.0) -> None:
        self.shut = True


class Failures:
    def __init__(self) -> None:
        self.counted: list[str] = []

    def exporter_failed(self, exporter: str) -> None:
        self.counted.append(exporter)


def test_failing_exporter_is_counted_and_isolated() -> None:
    """An exporter that raises is counted per event; the next exporter still gets every event."""
    keeper, failures = Keeper(), Failures()
    fanout = Fanout([Broken(), keeper], failures=failures)
    for i in range(3):
        fanout.export(
            Finished(Event(request_id=f"r{i}"), Clock(received=0, end=1), 0, new_ids(None))
        )
    assert keeper.seen == ["r0", "r1", "r2"]
    assert failures.counted == ["broken"] * 3
    fanout.shutdown()
    assert keeper.shut
