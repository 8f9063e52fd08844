"""The mutable state of one request while the sidecar relays it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from obs.config import Lane
from obs.events import Event
from obs.phases import Clock, ms
from obs.sidecar.endings import Ending, outcome
from obs.sidecar.outcomes import Refusal, RelayError
from obs.sidecar.policy.admission import LaneGate, Ticket
from obs.sidecar.policy.pool_gate import Hold, PoolGate
from obs.sidecar.policy.rate_limit import Charge
from obs.sidecar.pools.upstream import Response
from obs.sidecar.record.recorder import Start
from obs.sidecar.relay.json_answers import JsonAnswer
from obs.sidecar.relay.payloads import GENERATE_ROUTES, PASSTHROUGH_ROUTES, fingerprint
from obs.sidecar.relay.stored import STORED_ROUTES, Stored
from obs.sidecar.server.client import ClientConn
from obs.tracecontext import TraceIds

# Inter-token gaps kept per request (an endless stream stays bounded): the stream's sink
# (obs.sidecar.relay.streaming), their only writer, keeps the first ones.
MAX_GAPS = 100_000


class EventTime:
    """An event's ``ts`` (ISO 8601, UTC, milliseconds: ``2026-11-30T03:12:45.123+00:00``) from
    wall-clock nanoseconds, its date and time formatted once a second (a third of
    ``datetime.fromtimestamp(...).isoformat(...)``'s cost, per request on the loop)."""

    __slots__ = ("_prefix", "_second")

    def __init__(self) -> None:
        self._second, self._prefix = -1, ""

    def __call__(self, wall_ns: int) -> str:
        second, ns = divmod(wall_ns, 1_000_000_000)
        if second != self._second:
            self._second = second
            self._prefix = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        return f"{self._prefix}.{ns // 1_000_000:03d}+00:00"


@dataclass(frozen=True, slots=True)
class Plan:
    """What the request side decided: the lane and its gate, the admission cost, and what
    goes to the pool (the client's headers, the body as sent, whether usage was injected)."""

    lane: Lane
    gate: LaneGate
    cost: int
    headers: dict[str, str]
    raw: bytes
    inject: bool


class Request:
    """Mutable state of one request while it is relayed."""

    __slots__ = (
        "admitted",
        "answer_id",
        "capture_body",
        "capture_frames",
        "capture_whole",
        "charge",
        "client_id",
        "clock",
        "conn",
        "delivered",
        "disconnected",
        "done",
        "event",
        "first_read_chunks",
        "gate",
        "ids",
        "itl",
        "json_answer",
        "method",
        "operation",
        "outcome",
        "pending_body",
        "placed",
        "pool_admitted",
        "pool_gate",
        "pool_hold",
        "prefix_key",
        "response",
        "share_key",
        "started",
        "stored",
        "target",
        "ticket",
        "wall_ns",
    )

    def __init__(self, route: str, received_ns: int | None = None) -> None:
        now = time.perf_counter_ns()
        # The queue phase starts when the request's first bytes were read, where the server
        # says when that was (time waiting for the event loop is the sidecar's own queue);
        # once the body is read, it moves to when the body was complete (``body_complete``).
        received = received_ns if received_ns is not None and received_ns <= now else now
        self.clock = Clock(received=received)
        self.wall_ns = time.time_ns() - (now - received)
        self.event = Event(route=route)
        self.method, self.target = "POST", route  # as sent to the pool (target: path?query)
        self.stored: Stored | None = None  # a request that names a stored response, or makes one
        self.answer_id: str | None = None  # the id of the answer: a response's, to remember
        self.ids: TraceIds | None = None
        self.itl: list[int] = []  # the first MAX_GAPS inter-token gaps
        self.operation = (
            GENERATE_ROUTES.get(route)
            or PASSTHROUGH_ROUTES.get(route)
            or STORED_ROUTES.get(route, "http")
        )
        self.response: Response | None = None
        self.json_answer: JsonAnswer | None = None  # set when the request asks for JSON
        self.pending_body: dict[str, Any] | None = None  # a generate body, until ``annotate``
        self.placed: Start | None = None  # its record's start, until it is sent (Relay._sent)
        self.started = False  # response headers sent to the client
        self.done = False  # last byte sent (a later disconnect is not the client leaving)
        self.disconnected = False
        # The stream's [DONE] frame was handed to the client: a disconnect after it is the client
        # closing a finished response (the openai SDK does), not leaving one.
        self.delivered = False
        self.first_read_chunks = 0  # tokens that arrived in the first output read (obs.record)
        self.conn: ClientConn | None = None  # the client connection, under our server
        self.gate: LaneGate | None = None
        self.ticket: Ticket | None = None  # what the request holds (or waits for) of its lane
        self.share_key = ""  # what fair share counts it under (obs.sidecar.policy.auth.Tenants)
        self.admitted = False
        # Flow control (obs.sidecar.relay.flow): the rate-limit charge, and the saturated
        # pool's gate the request waits at or holds.
        self.charge: Charge | None = None
        self.pool_gate: PoolGate | None = None
        self.pool_hold: Hold | None = None
        self.pool_admitted = False
        self.client_id: str | None = None  # who sent it, for slow-reader learning
        self.prefix_key: str | None = None  # its prompt's leading key (recognition)
        self.outcome: RelayError | None = None  # how it ended, once settled (None: ok so far)
        # Kept for --capture-text only (None otherwise): read when the request ends.
        self.capture_body: dict[str, Any] | None = None
        self.capture_frames: list[bytes] | None = None
        self.capture_whole: bytes | None = None

    def body_complete(self, at_ns: int | None) -> None:
        """The request's body was complete at ``at_ns`` (None: not known): the server-side
        clock starts there, and the upload before it is the client's (``upload_ms``)."""
        if at_ns is None:
            return
        upload = min(at_ns, time.perf_counter_ns()) - self.clock.received
        if upload > 0:
            self.clock.received += upload
            self.wall_ns += upload
        self.event.upload_ms = ms(max(upload, 0))

    def annotate(self) -> None:
        """What a generate request's body tells its record and its answer check (the prompt's
        prefix fingerprint, whether it asks for JSON), worked out once: as its request is
        written to the pool (off its time to first token: the pool is working), before
        routing where the lane routes by prefix, or as it ends never sent."""
        body, self.pending_body = self.pending_body, None
        if body is not None:
            self.event.prefix_fingerprint = fingerprint(body)
            self.json_answer = JsonAnswer.asked_by(body)  # None unless it asks for JSON

    def settle(self, ended: RelayError | Ending | Refusal, phase: str | None) -> RelayError:
        """How the request ended: its outcome (``obs.sidecar.endings.outcome`` of a step's
        ending or a refusal), recorded on its event once. The first one settled stands; it
        is returned, so what the client is answered is written from the same object as the
        event (``obs.sidecar.relay.respond``)."""
        if self.outcome is None:
            settled = ended if isinstance(ended, RelayError) else outcome(ended)
            self.outcome = settled
            settled.record(self.event, phase)
        return self.outcome

    def release(self) -> None:
        """Give back the lane slot and the pool's room (once): when the pool is done, before
        a slow client is."""
        if self.admitted and self.gate is not None and self.ticket is not None:
            self.admitted = False
            self.gate.release(self.ticket)
        if self.pool_admitted and self.pool_gate is not None:
            self.pool_admitted = False
            self.pool_gate.release()
