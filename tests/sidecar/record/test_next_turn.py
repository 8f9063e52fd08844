"""NextTurn: a record whose client's next request is already relayed goes on at the event
loop's next turn, after the steps before it, and every record still reaches the exporter in
the order it ended."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from obs.events import Event
from obs.phases import Clock
from obs.record import Finished
from obs.sidecar.record.recorder import NextTurn, Recorder, StampConfig, Timings
from obs.tracecontext import new_ids

MS = 1_000_000


def _finished(rid: str, *, waiting: bool) -> Finished:
    clock = Clock(received=0, dispatched=2 * MS, first_up=10 * MS, first_sent=11 * MS,
                  last_up=20 * MS, end=21 * MS)  # fmt: skip
    ev = Event(request_id=rid, stream=True)
    return Finished(ev, clock, 0, new_ids(None), next_waiting=waiting)


def _recorder(out: list[Finished]) -> Recorder:
    return Recorder([Timings(), NextTurn(), StampConfig("cfg")], out.append)


def test_a_waiting_record_goes_on_at_the_next_turn_after_the_steps_before() -> None:
    """The steps before NextTurn run at once; the rest, and the export, a loop turn later."""
    out: list[Finished] = []

    async def run() -> tuple[int, float | None, str | None]:
        rec = _recorder(out)
        f = _finished("a", waiting=True)
        rec.end(f)
        before = (len(out), f.event.e2e_ms, f.event.config_fingerprint)
        await asyncio.sleep(0)
        return before

    count, e2e, stamped = asyncio.run(run())
    assert (count, e2e, stamped) == (0, 21, None)
    assert [f.event.request_id for f in out] == ["a"]
    assert out[0].event.config_fingerprint == "cfg"


def test_a_record_with_no_next_request_is_exported_at_once() -> None:
    """Without a next request under way, the whole pipeline runs in the relay's call."""
    out: list[Finished] = []

    async def run() -> int:
        _recorder(out).end(_finished("a", waiting=False))
        return len(out)

    assert asyncio.run(run()) == 1


def test_a_later_record_never_overtakes_a_held_one() -> None:
    """A record that ends while another is held goes out after it, in the same call."""
    out: list[Finished] = []

    async def run() -> list[str]:
        rec = _recorder(out)
        rec.end(_finished("held", waiting=True))
        rec.end(_finished("next", waiting=False))
        return [f.event.request_id for f in out]

    assert asyncio.run(run()) == ["held", "next"]


@given(st.lists(st.booleans(), max_size=12), st.lists(st.integers(0, 3), max_size=12))
def test_records_are_exported_in_the_order_they_ended(
    waiting: list[bool], turns: list[int]
) -> None:
    """Whatever records are held and however many loop turns pass between their ends, the
    exporter receives every record once, in the order they ended."""
    out: list[Finished] = []

    async def run() -> None:
        rec = _recorder(out)
        for i, w in enumerate(waiting):
            rec.end(_finished(str(i), waiting=w))
            for _ in range(turns[i] if i < len(turns) else 0):
                await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(run())
    assert [f.event.request_id for f in out] == [str(i) for i in range(len(waiting))]
