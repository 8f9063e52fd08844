"""The sidecar's own errors, mapped to HTTP status and an OpenAI-style body in one place."""

from __future__ import annotations

import orjson

from obs import conventions as c
from obs.errors import ObsError


class RelayError(ObsError):
    """An error the sidecar answers itself. Subclasses fix status, type and error class."""

    status = 500
    type_ = "InternalServerError"
    error_class = "internal"
    retry_after: int | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

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


class ShuttingDown(RelayError):
    """The sidecar's shutdown grace ended while the request was still running."""

    status = 503
    type_ = "ServiceUnavailableError"
    error_class = "shutdown"


class UpstreamTimeout(RelayError):
    status = 504
    type_ = "GatewayTimeoutError"
    error_class = "upstream_timeout"


class SlowClientStalled(RelayError):
    """The client read nothing for the lane's ``slow_client.max_blocked_s``."""

    status = 408
    type_ = "SlowClientError"
    error_class = "slow_client"


class UpstreamProtocol(RelayError):
    status = 502
    type_ = "BadGatewayError"
    error_class = "upstream_protocol"


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
    return orjson.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    )


def sse_error_frame(message: str, type_: str, code: int) -> bytes:
    """An error inside an already-started stream, as vLLM sends it, then ``[DONE]``."""
    return b"data: " + error_body(message, type_, code) + b"\n\ndata: [DONE]\n\n"
