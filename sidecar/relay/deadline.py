"""The first-token and idle deadlines of one upstream response, on one lazy timer.

A lane's ``timeouts.first_token_s`` runs from dispatch to the first output token;
``timeouts.idle_s`` bounds each silence after it. One read timeout cannot serve
both, so the sidecar's pool connections have none and this watchdog keeps both.
The relay's hot path stores one timestamp per read (``last_ns``); the timer wakes
when a deadline could have passed, re-arms itself if data came meanwhile, and
otherwise closes the upstream response with its verdict (``outcomes.Expired``) as the
failure: whatever reads the response fails with it, the mapping table makes it the outcome
(``obs.sidecar.endings``), and vLLM aborts the request when its connection closes. While
the relay waits on a slow client (``sending``) the pool's silence is the client's doing:
the timer re-arms, up to the lane's ``slow_client.max_blocked_s`` of waiting; then the
stream ends with a ``STALLED`` verdict and, a moment later (once the relay has recorded
it), the client's connection is closed, so a client that never reads cannot hold a lane
slot for ever.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from obs.sidecar.outcomes import FIRST_TOKEN, IDLE, STALLED, Expired
from obs.sidecar.pools.upstream import Response
from obs.sidecar.server.client import ClientConn

NS = 1_000_000_000
CLIENT_CLOSE_AFTER_S = 1.0  # after a stalled stream ends: time for its error to be recorded


class Deadline:
    """Watch ``resp`` from ``started_ns`` (``now_ns`` of dispatch) until ``cancel``.

    ``now_ns``: the clock of ``started_ns`` and of the reads' ``last_ns`` (the relay's
    ``perf_counter_ns``; a test gives its event loop's time, to run the deadlines in
    virtual time). Its timer runs on the event loop's own clock, which must run with it."""

    __slots__ = (
        "_blocked_ns", "_blocked_s", "_client", "_first_ns", "_first_s", "_handle", "_idle_ns",
        "_idle_s", "_loop", "_now_ns", "_resp", "_sending_since", "expired", "last_ns",
    )  # fmt: skip

    def __init__(
        self,
        resp: Response,
        started_ns: int,
        first_token_s: float,
        idle_s: float,
        max_blocked_s: float = float("inf"),
        client: ClientConn | None = None,
        now_ns: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._now_ns = now_ns
        self._resp = resp
        self._first_s, self._idle_s = first_token_s, idle_s
        self._first_ns = started_ns + int(first_token_s * NS)
        self._idle_ns = int(idle_s * NS)
        self.last_ns = 0  # the last read since the first output token; 0: none yet
        self._sending_since = 0  # the relay waits on the client since: a silence not the pool's
        self._blocked_s = max_blocked_s
        self._blocked_ns = int(min(max_blocked_s, 1e9) * NS)
        self._client = client
        self.expired: Expired | None = None  # the verdict, once a deadline passed
        self._handle = self._arm(self._first_ns, self._now_ns())

    def _arm(self, due_ns: int, now_ns: int) -> asyncio.TimerHandle:
        return self._loop.call_later(max(0, due_ns - now_ns) / NS, self._check)

    @property
    def sending(self) -> bool:
        """The relay waits on the client (set by the stream while the client is behind)."""
        return self._sending_since != 0

    @sending.setter
    def sending(self, waiting: bool) -> None:
        if not waiting:
            self._sending_since = 0
            return
        now = self._now_ns()
        self._sending_since = now
        stall_at = self._loop.time() + self._blocked_ns / NS
        if self._handle.when() > stall_at:  # wake in time to end a stalled stream
            self._handle.cancel()
            self._handle = self._arm(now + self._blocked_ns, now)

    def _check(self) -> None:
        now = self._now_ns()
        due = self.last_ns + self._idle_ns if self.last_ns else self._first_ns
        if self._sending_since:
            stalled_at = self._sending_since + self._blocked_ns
            if now >= stalled_at:
                self._stalled()
                return
            due = min(now + self._idle_ns, stalled_at)
        if now < due:  # data came since the timer was set (or the loop woke early)
            self._handle = self._arm(due, now)
            return
        if self.last_ns:
            self.expired = Expired(IDLE, self._idle_s)
        else:
            self.expired = Expired(FIRST_TOKEN, self._first_s)
        self._resp.close(self.expired)

    def _stalled(self) -> None:
        self.expired = Expired(STALLED, self._blocked_s)
        self._resp.close(self.expired)
        if self._client is not None:
            self._loop.call_later(CLIENT_CLOSE_AFTER_S, self._client.abort)

    def first_output(self, now_ns: int) -> None:
        """The first output token came: from now on, the idle deadline (re-armed once)."""
        self.last_ns = now_ns
        self._handle.cancel()
        self._handle = self._arm(now_ns + self._idle_ns, now_ns)

    def cancel(self) -> None:
        self._handle.cancel()
