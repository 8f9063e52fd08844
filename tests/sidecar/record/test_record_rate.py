"""obs.sidecar.record.record_rate, directly: the client-event budget and its summary records."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from obs import conventions as c
from obs.events import Event
from obs.sidecar.record.record_rate import SUMMARY_PREFIX, RefusedRecord, client_caused


class FakeClock:
    """Time the test sets (the budget's monotonic and wall clocks)."""

    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


def _budget(per_s: float, clock: FakeClock) -> RefusedRecord:
    return RefusedRecord(per_s, CollectorRegistry(), clock=clock, wall=clock)


def _refused(lane: str = "chat", status: str = c.REJECTED, reason: str | None = "queue_full"):
    return Event(lane=lane, status=status, rejection_reason=reason, http_status=429)


def test_only_client_caused_events_before_a_pool_are_budgeted() -> None:
    """Refusals, client errors and disconnects without a replica (or without output) count;
    the rest never do."""
    assert client_caused(_refused())
    assert client_caused(Event(status=c.DISCONNECTED))
    assert client_caused(Event(status=c.CLIENT_ERROR))
    assert not client_caused(Event(status=c.DISCONNECTED, replica="http://r", output_chunks=1))
    assert not client_caused(Event(status=c.ERROR))
    assert not client_caused(Event(status=c.OK))


def test_over_the_budget_events_become_one_summary_per_lane_and_outcome() -> None:
    """Past the burst, skipped events are summed per (lane, outcome) into summary records."""
    clock = FakeClock()
    budget = _budget(2, clock)
    kept = [budget.keep(_refused("a")) for _ in range(5)] + [budget.keep(_refused("b"))]
    assert kept == [True, True, False, False, False, False]
    assert not budget.due()
    clock.t += 1.0
    assert budget.due()
    summaries = {e.lane: e for e in budget.flush()}
    assert {k: e.summarized for k, e in summaries.items()} == {"a": 3, "b": 1}
    assert all(e.request_id.startswith(SUMMARY_PREFIX) for e in summaries.values())
    assert summaries["a"].rejection_reason == "queue_full" and summaries["a"].http_status == 429
    assert budget.flush() == []


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.floats(0, 0.5)), max_size=200))
def test_written_plus_summarized_equals_every_event(arrivals: list[tuple[str, float]]) -> None:
    """Whatever the arrival pattern, events kept plus summaries' counts equal events seen."""
    clock = FakeClock()
    budget = _budget(3, clock)
    kept = 0
    for lane, gap in arrivals:
        clock.t += gap
        kept += budget.keep(_refused(lane))
    summarized = sum(e.summarized or 0 for e in budget.flush())
    assert kept + summarized == len(arrivals)
    assert kept <= 3 + 3 * (clock.t - 1_000.0) + 1


def test_leaving_right_after_dispatch_is_under_the_budget() -> None:
    """A client that leaves once its request reached a pool, before any output, counts under
    the event budget (a flood of them was 454 full events a second); one that left mid-stream
    is a real request's record, always written."""
    gone = Event(status=c.DISCONNECTED, replica="http://10.0.0.1:8000", output_chunks=0)
    mid_stream = Event(status=c.DISCONNECTED, replica="http://10.0.0.1:8000", output_chunks=3)
    assert client_caused(gone)
    assert not client_caused(mid_stream)
    assert not client_caused(Event(status=c.ERROR, replica="http://10.0.0.1:8000"))
