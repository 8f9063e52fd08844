"""One home for how a request ends: every outcome, and the table from lower errors to them.

Each outcome (a ``RelayError``) knows its HTTP status, OpenAI error body, SSE frame and what
the event records (``record``): what the client reads and what the event says come from one
object. Ok (no object); the client's mistakes (``BadRequest``, ``Unauthorized``, ``NotFound``,
``MethodNotAllowed``, ``PayloadTooLarge``); refusals (``RequestLimit``, ``Rejected``,
``TraceExportRefused``); the pool's (``UpstreamUnavailable``, ``PoolStatus``, ``EngineQueueFull``,
``UpstreamTimeout``, ``UpstreamProtocol``, ``PoolErrorFrame``; ``FallBack``: on to the lane's
fallback pool); the lane's deadline on a whole answer (``AnswerDeadline``); ``ClientLeft``,
``SlowClientStalled``, the shutdown, our own bug (``Internal``). ``LOWER`` maps each lower
exception to its outcome (a deadline's verdict, ``Expired``, among them);
tests/sidecar/test_outcomes.py fails on one it lacks.

No step builds an outcome: a refusal is a plain ``Refusal`` (policy returns it, a parser or
the server's connection raises it as ``Refused``) and a relay step's ending an
``obs.sidecar.endings.Ending``; ``endings.outcome`` makes either the outcome, once (the
factories here, ``refused`` and ``lower_outcome``, are what it asks).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from obs import conventions as c
from obs.errors import ObsError
from obs.events import Event
from obs.openai_api import error_code

MAX_MESSAGE = 300  # characters of an error's message the event keeps
# An engine's out-of-memory failure, in its error text: PyTorch's "CUDA out of memory" /
# torch.OutOfMemoryError (vLLM's 500 body or error frame), llama.cpp's "failed to allocate".
OOM_TEXT = re.compile(r"out of memory|OutOfMemoryError|failed to allocate", re.IGNORECASE)
OOM = "oom"


def pool_error_class(status: int, message: str, default: str) -> str:
    """``oom`` for a server-side failure whose text says the engine ran out of memory,
    else ``default``: an OOM reads apart from any other 5xx."""
    return OOM if status >= 500 and OOM_TEXT.search(message) else default


class RelayError(ObsError):
    """An error the sidecar answers itself. Subclasses fix status, type and error class."""

    status = 500
    type_ = "InternalServerError"
    error_class = "internal"
    retry_after: int | None = None
    rejection_reason: str | None = None  # what the event's rejection_reason says, if anything

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def event_status(self) -> str:
        """The event's status: by the HTTP status (``outcome``) unless the type says more."""
        return outcome(self.status)

    def recorded_message(self) -> str | None:
        """The event's ``error_message``: the client's message unless the type keeps more."""
        return self.message[:MAX_MESSAGE]

    def record(self, ev: Event, phase: str | None) -> None:
        """This outcome on the event: status, error class, message, phase (and a refusal's
        reason), the one place they are written."""
        ev.status = self.event_status()
        if self.rejection_reason is not None:
            ev.rejection_reason = self.rejection_reason
        ev.error_class = self.error_class
        ev.error_message = self.recorded_message()
        ev.error_phase = phase

    def body(self) -> bytes:
        return error_body(self.message, self.type_, self.status, self.param)

    def sse_frame(self) -> bytes:
        """This error inside an already-started stream, then ``[DONE]``."""
        return sse_error_frame(self.message, self.type_, self.status)

    def headers(self) -> list[tuple[bytes, bytes]]:
        h = [(b"content-type", b"application/json")]
        if self.retry_after is not None:
            h.append((b"retry-after", str(self.retry_after).encode()))
        return h


class BadRequest(RelayError):
    status = 400
    type_ = "BadRequestError"
    error_class = "bad_request"


class Unauthorized(RelayError):
    status = 401
    type_ = "AuthenticationError"
    error_class = "unauthorized"


class PayloadTooLarge(RelayError):
    status = 413
    type_ = "PayloadTooLargeError"
    error_class = "bad_request"


class NotFound(RelayError):
    status = 404
    type_ = "NotFoundError"
    error_class = "bad_request"


class MethodNotAllowed(RelayError):
    status = 405
    type_ = "MethodNotAllowedError"
    error_class = "bad_request"


class UpstreamUnavailable(RelayError):
    """No replica of the pool accepted a connection."""

    status = 503
    type_ = "ServiceUnavailableError"
    error_class = "upstream_connect"
    retry_after = 1
    rejection_reason = c.POOL_UNAVAILABLE  # still an error: it counts against the SLOs


class ShuttingDown(RelayError):
    """The sidecar's shutdown grace ended while the request was still running."""

    status = 503
    type_ = "ServiceUnavailableError"
    error_class = "shutdown"


class UpstreamTimeout(RelayError):
    status = 504
    type_ = "GatewayTimeoutError"
    error_class = "upstream_timeout"


class AnswerDeadline(UpstreamTimeout):
    """A non-streamed answer not whole within first_token_s: the lane's deadline, no pool fault."""

    error_class = "deadline"  # its head comes with its last token: the pool was generating


class SlowClientStalled(RelayError):
    """The client read nothing for the lane's ``slow_client.max_blocked_s``."""

    status = 408
    type_ = "SlowClientError"
    error_class = "slow_client"


class UpstreamProtocol(RelayError):
    status = 502
    type_ = "BadGatewayError"
    error_class = "upstream_protocol"


class Internal(RelayError):
    """A fault in the sidecar itself: the client reads a plain 500, the event keeps the cause."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("internal error in the sidecar")
        self.cause = cause

    def recorded_message(self) -> str | None:
        return f"{self.message}: {self.cause!r}"[:MAX_MESSAGE]


class ClientLeft(RelayError):
    """The client went away before the end: nothing is sent, the event says it left."""

    status = 499  # nginx's "client closed request"
    type_ = "ClientClosedRequest"
    error_class = "client_disconnect"

    def __init__(self) -> None:
        super().__init__("the client closed the connection before the response ended")

    def event_status(self) -> str:
        return c.DISCONNECTED

    def recorded_message(self) -> str | None:
        return None


class PoolStatus(RelayError):
    """The pool answered with an error status; its body reaches the client as it came."""

    error_class = "upstream_status"

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.type_ = _type_of(status)
        self.error_class = pool_error_class(status, message, self.error_class)


class EngineQueueFull(RelayError):
    """vLLM's own admission refused the request (503: ``--max-num-queued-reqs``/-tokens)."""

    status = 503
    type_ = "ServiceUnavailableError"
    error_class = "admission"
    rejection_reason = c.ENGINE_QUEUE_FULL

    def event_status(self) -> str:
        return c.REJECTED


class PoolErrorFrame(RelayError):
    """An error frame the pool sent inside its stream, relayed as it came; its ``code`` says
    whose mistake it was (none: the pool's)."""

    error_class = "upstream_stream_error"

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(str(error.get("message", "")))
        code = error_code(error)
        self.status = code if code is not None else 502
        self.type_ = str(error.get("type") or _type_of(self.status))
        self.error_class = pool_error_class(self.status, self.message, self.error_class)


def pool_status(status: int, message: str) -> RelayError:
    """The outcome of the pool's error status ``status`` with ``message`` in its body."""
    return EngineQueueFull(message) if status == 503 else PoolStatus(status, message)


def outcome(status: int | None) -> str:
    """The event status of a failure answered with HTTP ``status`` (a response's, an error
    frame's ``code``, the sidecar's own): a 4xx is the client's (``client_error``); a 5xx,
    or an error that names no status, is the pool's or the sidecar's (``error``), the only
    kind the availability SLO counts."""
    return c.CLIENT_ERROR if status is not None and 400 <= status < 500 else c.ERROR


def for_status(status: int, message: str) -> RelayError:
    """The sidecar's error for an HTTP status the framework raised (``Error`` if unmapped)."""
    for cls in _BY_STATUS:
        if cls.status == status:
            return cls(message)
    err = RelayError(message)
    err.status, err.type_ = status, "Error"
    return err


def _type_of(status: int) -> str:
    """The OpenAI error type of ``status`` (``Error`` if unmapped)."""
    return next((cls.type_ for cls in _BY_STATUS if cls.status == status), "Error")


_BY_STATUS: tuple[type[RelayError], ...] = (
    BadRequest,
    Unauthorized,
    NotFound,
    MethodNotAllowed,
    SlowClientStalled,
    PayloadTooLarge,
    UpstreamProtocol,
    UpstreamUnavailable,
    UpstreamTimeout,
)


def error_body(message: str, type_: str, code: int, param: str | None = None) -> bytes:
    """The error JSON vLLM and OpenAI use: ``{"error": {message, type, param, code}}``."""
    error = {"message": message, "type": type_, "param": param, "code": code}
    return orjson.dumps({"error": error})


def sse_error_frame(message: str, type_: str, code: int) -> bytes:
    """An error inside an already-started stream, as vLLM sends it, then ``[DONE]``."""
    return b"data: " + error_body(message, type_, code) + b"\n\ndata: [DONE]\n\n"


class Rejected(RelayError):
    """Refused by the lane's admission policy; ``reason`` is one of c.REJECTION_REASONS."""

    error_class = "admission"

    def __init__(self, reason: str, message: str, status: int, retry_after: int | None) -> None:
        super().__init__(message)
        self.reason = self.rejection_reason = reason
        self.status = status
        self.type_ = {413: "PayloadTooLargeError", 429: "RateLimitError"}.get(
            status, "ServiceUnavailableError"
        )
        self.retry_after = retry_after

    def event_status(self) -> str:
        return c.REJECTED


class RateLimited(Rejected):
    """429 of a rate limit (obs.sidecar.policy.rate_limit), with OpenAI's x-ratelimit-*."""

    def __init__(self, reason: str, msg: str, retry: int, more: list[tuple[bytes, bytes]]) -> None:
        super().__init__(reason, msg, 429, retry)
        self.more = more

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [*super().headers(), *self.more]


class RequestLimit(RelayError):
    """The connection's limits refused the request (``limit``: the guard's counter): the
    server answers it (status and body from this object) and closes the connection; a
    request whose head was read reaches the relay, which records the same object. A 503
    (too many connections, or bodies held) is the sidecar shedding load: a rejection, not
    an error against the SLOs; a 4xx is the client's."""

    type_ = "RequestLimitError"
    error_class = "request_limit"

    def __init__(self, status: int, limit: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.limit = limit

    def event_status(self) -> str:
        return c.REJECTED if self.status == 503 else outcome(self.status)


class TraceExportRefused(RelayError):
    """``POST /v1/traces`` refused (``reason``: the refusal counter's label)."""

    type_ = "TraceExportRefused"
    error_class = "bad_request"

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


# ---- refusals: a decision not to serve, as a value ------------------------------------

# Whose rule refused a request (``Refusal.by``).
CLIENT = "client"  # the client's mistake: 400, 401, 404, 405, 413 (the status says which)
ADMISSION = "admission"  # a lane's or pool's gate, a rate limit: ``reason`` in REJECTION_REASONS
CONNECTION = "connection"  # the server's connection limits: ``reason`` names the limit
TRACES = "traces"  # the OTLP trace route (``reason``: its refusal counter's label)

RATE_REASONS = frozenset({c.RATE_LIMIT_REQUESTS, c.RATE_LIMIT_TOKENS})


@dataclass(frozen=True, slots=True)
class Refusal:
    """A decision not to serve a request: whose rule (``by``), why (``reason``, ``detail``:
    what the client reads), the status, and when to retry; ``headers`` a rate limit adds
    (``x-ratelimit-*``)."""

    status: int
    detail: str
    reason: str | None = None
    by: str = CLIENT
    retry_after: int | None = None
    headers: tuple[tuple[bytes, bytes], ...] = ()


class Refused(Exception):
    """A ``Refusal`` raised from where the step that found it cannot return it (a parser, a
    callback); whoever answers catches it and asks ``outcome``."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.detail)
        self.refusal = refusal


def refused(r: Refusal) -> RelayError:
    """The outcome of the refusal ``r`` (``obs.sidecar.endings.outcome`` asks here)."""
    if r.by == ADMISSION:
        assert r.reason is not None
        if r.reason in RATE_REASONS:
            assert r.retry_after is not None
            return RateLimited(r.reason, r.detail, r.retry_after, list(r.headers))
        return Rejected(r.reason, r.detail, r.status, r.retry_after)
    if r.by == CONNECTION:
        return RequestLimit(r.status, r.reason or "", r.detail)
    if r.by == TRACES:
        return TraceExportRefused(r.status, r.reason or "", r.detail)
    return for_status(r.status, r.detail)  # the client's mistake, by its status


class FallBack(Exception):
    """The pool refused, failed or timed out before the first byte: try the fallback pool."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason  # one of conventions.FALLBACK_REASONS


# ---- what the lower layers raise, and the table to outcomes ---------------------------


class UpstreamError(Exception):
    """The pool's connection failed; ``str()`` says how, for the event's error message."""


class ConnectFailed(UpstreamError):
    """No connection: refused, unreachable, or not accepted within ``connect_s``."""


FIRST_TOKEN, IDLE, STALLED = "first_token", "idle", "stalled"  # which deadline passed


class Expired(UpstreamError):
    """A deadline's verdict on the pool's response (obs.sidecar.relay.deadline): the response
    is closed with it as its failure, so whatever reads the response fails with it and the
    table below makes it the outcome. ``kind``: ``FIRST_TOKEN`` (no first token within the
    lane's ``first_token_s``), ``IDLE`` (a silence past ``idle_s``), ``STALLED`` (the client
    read nothing for ``slow_client.max_blocked_s``); ``seconds``: that bound."""

    def __init__(self, kind: str, seconds: float) -> None:
        super().__init__(f"{kind} deadline ({seconds:g} s)")
        self.kind, self.seconds = kind, seconds


def _unavailable(err: BaseException, doing: str) -> RelayError:
    return UpstreamUnavailable(f"no replica accepted a connection while {doing} ({err})")


def _protocol(err: BaseException, doing: str) -> RelayError:
    return UpstreamProtocol(str(err))


def _timeout(err: BaseException, doing: str) -> RelayError:
    return UpstreamTimeout(f"the pool stopped sending while {doing} (idle timeout)")


def _broken(err: BaseException, doing: str) -> RelayError:
    return UpstreamProtocol(f"the pool's connection failed while {doing}: {err.__class__.__name__}")


def _expired(err: BaseException, doing: str) -> RelayError:
    assert isinstance(err, Expired)
    s = err.seconds
    if err.kind == STALLED:
        return SlowClientStalled(
            f"the client read nothing for {s:g} s (the lane's slow_client.max_blocked_s); "
            "the stream was ended"
        )
    if err.kind == IDLE:
        return UpstreamTimeout(f"the pool stopped sending while streaming (idle timeout: {s:g} s)")
    return UpstreamTimeout(
        f"the pool sent no first token within the lane's first_token_s ({s:g} s)"
    )


def _refusal(err: BaseException, doing: str) -> RelayError:
    assert isinstance(err, Refused)
    return refused(err.refusal)


def _ours(err: BaseException, doing: str) -> RelayError:
    return Internal(err)


def _itself(err: BaseException, doing: str) -> RelayError:
    assert isinstance(err, RelayError)
    return err


# Each lower exception's outcome, by class (the first entry along the class's MRO wins).
LOWER: dict[type[BaseException], Callable[[BaseException, str], RelayError]] = {
    RelayError: _itself,  # an outcome already
    Refused: _refusal,  # a refusal raised where it could not be returned
    Expired: _expired,  # a deadline's verdict, the response's failure (relay.deadline)
    ConnectFailed: _unavailable,  # the pool client: no connection
    UpstreamError: _protocol,  # the pool client: the pool broke HTTP, or its connection
    TimeoutError: _timeout,  # a deadline on a read of the pool
    OSError: _broken,  # a socket error the pool client did not wrap
    RuntimeError: _ours,  # the server refusing an impossible ASGI message: our bug
}


def lower_outcome(err: BaseException, doing: str) -> RelayError:
    """The outcome of ``err``, raised while ``doing`` (``LOWER``); ``Internal`` for an
    exception the table does not name: a fault in the sidecar itself."""
    for cls in type(err).__mro__:
        make = LOWER.get(cls)
        if make is not None:
            return make(err, doing)
    return Internal(err)
