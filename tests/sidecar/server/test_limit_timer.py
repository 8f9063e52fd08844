"""A connection's limit timer: the armed limit expires, a moved deadline is kept, and timers
are made only when a deadline comes sooner (on the real event loop; no timing asserted)."""

from __future__ import annotations

import asyncio

import uvloop

from obs.sidecar.server.limit_timer import LimitTimer


async def _expiry(
    arms: list[tuple[float, str]], disarm_first: bool = False
) -> tuple[str, list[str], int]:
    """Arm each of ``arms`` in turn; the first limit that expires, all that did by then, and
    how many timers the loop was asked for."""
    loop = asyncio.get_running_loop()
    fired: list[str] = []
    first: asyncio.Future[str] = loop.create_future()

    def expired(limit: str) -> None:
        fired.append(limit)
        if not first.done():
            first.set_result(limit)

    timers = 0
    call_at = loop.call_at

    class Counting:  # the loop, counting the timers asked of it
        def time(self) -> float:
            return loop.time()

        def call_at(self, when: float, callback: object) -> asyncio.TimerHandle:
            nonlocal timers
            timers += 1
            return call_at(when, callback)  # type: ignore[arg-type]

    timer = LimitTimer(Counting(), expired)  # type: ignore[arg-type]
    for delay, limit in arms:
        if disarm_first:
            timer.disarm()
        timer.arm(delay, limit)
    got = await asyncio.wait_for(first, 30)
    await asyncio.sleep(0)
    timer.stop()
    return got, fired, timers


def test_the_limit_armed_last_is_the_one_that_expires_once() -> None:
    """Limits armed one after another (a later deadline each time) share the first one's
    timer, which sets itself again for the rest: the last limit expires, once."""
    got, fired, timers = uvloop.run(_expiry([(0.01, "header"), (0.02, "body"), (0.1, "idle")]))
    assert (got, fired) == ("idle", ["idle"])
    assert timers <= 2  # not one per limit armed


def test_a_sooner_deadline_replaces_the_pending_timer() -> None:
    """A limit due before the pending timer (10 minutes away) expires on its own time."""
    got, fired, timers = uvloop.run(_expiry([(600.0, "keep_alive"), (0.01, "header")]))
    assert (got, fired, timers) == ("header", ["header"], 2)


def test_a_disarmed_limit_never_expires() -> None:
    """Disarming leaves the timer pending but empty: only the limit armed after expires."""
    got, fired, _ = uvloop.run(_expiry([(0.01, "body"), (0.03, "keep_alive")], disarm_first=True))
    assert (got, fired) == ("keep_alive", ["keep_alive"])
