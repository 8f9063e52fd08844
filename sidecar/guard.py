"""Connection limits on the relay's port: header size and count, read timeouts, connections.

``GuardedHttpProtocol`` is the sidecar's uvicorn protocol (``SidecarHttpProtocol``)
with the limits of ``Limits`` enforced where the bytes arrive, before any of them
reach the app:

- request line, header bytes and header count: counted as the head is read (bytes
  across reads, then each header as parsed); past a limit the request is answered
  414 or 431 and the connection closed, so a 128 MB header costs one socket read,
  not the parser's growing copy of it;
- a header read timeout (first byte of a request to the end of its head: 408), a
  body read timeout (end of the head to the end of the body: 408, the relay sees
  the client leave), and an idle timeout for a connection that sends no request
  (closed; between requests uvicorn's keep-alive timeout, set to the same value);
- a maximum of open client connections: one more is answered 503 and closed;
- a request that asks to switch protocols (``Connection: upgrade`` with ``Upgrade``,
  or ``CONNECT``) is answered 400 and closed before any of it reaches the app, but
  for a GET or HEAD without a body, which is served as plain HTTP/1.1: the parser
  skips an upgrading request's body and would read it as the next request.

Every limit hit is counted (``vllm_obs_connection_limits_total{limit}``) and
logged at most once a minute per limit, with the count since the last line.

It also notes when each request's first bytes were read, for the event's
``queue`` phase: ``scope["extensions"]["vllm_obs"]["received_ns"]`` is the
``time.perf_counter_ns()`` of the ``data_received`` that started the request.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from obs import conventions as c
from obs.sidecar.budgets import Budgets
from obs.sidecar.client import OBS_EXTENSION, SidecarHttpProtocol
from obs.sidecar.errors import error_body
from obs.sidecar.limits import Limits

log = structlog.get_logger("vllm_obs.guard")

LIMITS = (
    "request_line", "header_bytes", "header_count", "header_timeout", "body_timeout",
    "idle_timeout", "max_connections", "client_connections", "body_memory", "upgrade",
)  # fmt: skip
LOG_EVERY_S = 60.0
_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 414: b"URI Too Long",
            431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}  # fmt: skip


class Guard:
    """The limits and their counters, shared by every connection of one server."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.budgets = Budgets(
            limits.max_connections,
            limits.client_connections,
            limits.max_body_memory,
            limits.client_body_memory,
        )
        self.hits = dict.fromkeys(LIMITS, 0)
        self._logged = dict.fromkeys(LIMITS, (-LOG_EVERY_S, 0))

    @property
    def open(self) -> int:
        """Client connections open now."""
        return self.budgets.connections

    def hit(self, limit: str) -> None:
        self.hits[limit] += 1
        now = time.monotonic()
        at, count = self._logged[limit]
        if now - at >= LOG_EVERY_S:
            log.warning("connection_limit", limit=limit, since_last_log=self.hits[limit] - count)
            self._logged[limit] = (now, self.hits[limit])

    def protocol(self) -> type[GuardedHttpProtocol]:
        """The protocol class for uvicorn's ``http=``, bound to this guard."""
        return type("GuardedHttpProtocol", (GuardedHttpProtocol,), {"guard": self})


class GuardCollector(Collector):
    """Exposes a guard's counters at scrape time (nothing is counted on the hot path)."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        m = c.CONNECTION_LIMITS
        hits = CounterMetricFamily(m.name, m.help, labels=m.labels)
        for limit, n in self.guard.hits.items():
            hits.add_metric([limit], n)
        yield hits
        g = c.CLIENT_CONNECTIONS
        yield GaugeMetricFamily(g.name, g.help, value=self.guard.open)


class _LimitHit(Exception):
    """Raised in a parser callback: the parser stops and ``send_400_response`` answers."""


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The declared body length (0 when there is none); None for a chunked body."""
    if any(k == b"transfer-encoding" for k, _ in headers):
        return None
    for k, v in headers:
        if k == b"content-length":
            return int(v) if v.strip().isdigit() else 0  # the parser refuses a bad one
    return 0


def _plain_get(method: bytes, headers: list[tuple[bytes, bytes]]) -> bool:
    """A GET or HEAD without a body: its ``Upgrade`` is ignored (served as HTTP/1.1)."""
    if method not in (b"GET", b"HEAD"):
        return False
    return not any(
        k == b"transfer-encoding" or (k == b"content-length" and v.strip() != b"0")
        for k, v in headers
    )


class GuardedHttpProtocol(SidecarHttpProtocol):
    """uvicorn's httptools protocol with the limits of its ``guard``."""

    guard: Guard

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_limit = ""
        self._in_message = False
        self._in_body = False
        self._head = 0  # bytes read since the current request's head began
        self._headers = 0
        self._header_bytes = 0  # name, value and separators of the headers parsed so far
        self._read_ns = 0
        self._counted = False
        self._refusal: tuple[int, str, str] | None = None
        self._addr = ""
        self._bodies: deque[int] = deque()  # body bytes held, per request not yet answered
        self._chunked = False

    # asyncio.Protocol
    # uvicorn's protocol narrows the transport to asyncio.Transport the same way.
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        g = self.guard
        self._addr = self.client[0] if self.client else ""
        over = g.budgets.connect(self._addr)
        if over is not None:
            whose = "the sidecar has" if over == "max_connections" else "this client has"
            self._refuse(503, over, f"{whose} too many open connections")
            return
        self._counted = True
        self._arm(g.limits.idle_timeout_s, "idle_timeout")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._counted:
            self._counted = False
            self.guard.budgets.disconnect(self._addr)
        self.guard.budgets.free_body(self._addr, sum(self._bodies))
        self._bodies.clear()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._in_message:  # the first read of a new request
            self._read_ns = time.perf_counter_ns()
            if self._timer_limit != "header_timeout":
                self._arm(self.guard.limits.header_timeout_s, "header_timeout")
        if not self._in_body:
            self._head += len(data)
        super().data_received(data)
        if (
            not self._in_body
            and self._head > self.guard.limits.max_header_bytes
            and not self.transport.is_closing()
        ):
            self._refuse(431, "header_bytes", "request headers are too large")

    # httptools callbacks
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_message = True
        self._headers = self._header_bytes = 0
        self.scope["extensions"][OBS_EXTENSION] = {
            "received_ns": self._read_ns or time.perf_counter_ns()
        }

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > self.guard.limits.max_request_line:
            self._refusal = (414, "request_line", "the request line is too long")
            raise _LimitHit

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers += 1
        self._header_bytes += len(name) + len(value) + 4
        if self._headers > self.guard.limits.max_headers:
            self._refusal = (431, "header_count", "the request has too many headers")
            raise _LimitHit
        if self._header_bytes + len(self.url) > self.guard.limits.max_header_bytes:
            self._refusal = (431, "header_bytes", "request headers are too large")
            raise _LimitHit
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self.parser.should_upgrade() and not _plain_get(self.parser.get_method(), self.headers):
            # httptools skips the body of a request that asks to switch protocols and parses
            # what follows as a new request: a body would be smuggled past a proxy in front.
            self._refusal = (400, "upgrade", "the sidecar does not switch protocols (Upgrade)")
            raise _LimitHit
        declared = _content_length(self.headers)
        self._chunked = declared is None
        self._bodies.append(0)
        if declared:
            self._hold_body(declared)
        self._in_body = True
        self._head = 0
        self._arm(self.guard.limits.body_timeout_s, "body_timeout")
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._chunked and self._bodies:  # no Content-Length: counted as it arrives
            self._hold_body(len(body))
        super().on_body(body)

    def on_response_complete(self) -> None:
        if self._bodies:  # the oldest request still held is the one answered
            self.guard.budgets.free_body(self._addr, self._bodies.popleft())
        super().on_response_complete()

    def on_message_complete(self) -> None:
        self._in_body = self._in_message = False
        self._disarm()
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        if self._refusal is None:
            super().send_400_response(msg)
            return
        status, limit, message = self._refusal
        self._refuse(status, limit, message)

    # limits
    def _hold_body(self, n: int) -> None:
        """Count ``n`` more bytes of the current request's body, within the budgets."""
        if not self.guard.budgets.hold_body(self._addr, n):
            self._refusal = (503, "body_memory", "the sidecar holds too many request bodies")
            raise _LimitHit
        self._bodies[-1] += n

    def _refuse(self, status: int, limit: str, message: str) -> None:
        """Answer ``status`` (when no response is under way) and close the connection."""
        self.guard.hit(limit)
        self._disarm()
        transport = self.transport
        if transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete or not self.cycle.response_started:
            body = error_body(message, "RequestLimitError", status)
            head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n" % (
                status, _REASONS[status]
            )  # fmt: skip
            transport.write(
                head + b"content-length: %d\r\nconnection: close\r\n\r\n%b" % (len(body), body)
            )
            if self.cycle is not None:  # the app's own answer, if any, goes nowhere
                self.cycle.response_complete = True
        transport.close()

    def _arm(self, delay_s: float, limit: str) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_limit = limit
        self._timer = self.loop.call_later(delay_s, self._expired, limit)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_limit = ""

    def _expired(self, limit: str) -> None:
        self._timer = None
        self._timer_limit = ""
        if limit == "idle_timeout":
            self.guard.hit(limit)
            self.transport.close()
        else:
            self._refuse(408, limit, f"the client was too slow sending the request ({limit})")
