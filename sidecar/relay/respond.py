"""What the relay itself sends a client: every response head, and an error's answer.

``send_head`` (or, in a socket's callback, ``start_head``) is the one place a relayed
request's response head goes out (the pool's
status and headers, or the sidecar's own error's), so the request's ``started`` flag, the
``x-request-id`` header and the event's ``http_status`` are kept one way. ``fail`` records
an error's outcome (``obs.sidecar.outcomes``) and answers it as far as the response has
gone: its status and JSON body before the head, its SSE frame inside a started stream,
nothing once the last byte was sent.
"""

from __future__ import annotations

from obs.sidecar.endings import Ending
from obs.sidecar.outcomes import Refusal, RelayError
from obs.sidecar.relay.request import Request
from obs.sidecar.server.client import ClientConn
from obs.sidecar.types import Send

BODY = "http.response.body"


async def send_head(
    req: Request, send: Send, status: int, headers: list[tuple[bytes, bytes]]
) -> None:
    """Start the client's response: ``status`` and ``headers`` (with the request's id)."""
    _started(req, status, headers)
    await send({"type": "http.response.start", "status": status, "headers": headers})


def start_head(
    req: Request, conn: ClientConn, status: int, headers: list[tuple[bytes, bytes]]
) -> bool:
    """``send_head`` inside a socket's callback (a stream started as the pool's head came:
    ``obs.sidecar.relay.streaming.stream_at_head``); False if the client has left (as
    ``send_head`` to a gone client, the request is marked started all the same)."""
    _started(req, status, headers)  # before the head is written: it adds x-request-id
    return conn.start(status, headers)


def _started(req: Request, status: int, headers: list[tuple[bytes, bytes]]) -> None:
    if not any(k == b"x-request-id" for k, _ in headers):
        headers.append((b"x-request-id", req.event.request_id.encode("latin-1")))
    req.event.http_status = status
    req.started = True


async def send_error(req: Request, send: Send, err: RelayError) -> None:
    """Answer ``err`` as far as the response has gone (see the module's doc)."""
    if req.done:
        return
    req.done = True
    if req.started:  # inside the stream, with the type and code the event records
        await send({"type": BODY, "body": err.sse_frame(), "more_body": False})
        return
    await send_head(req, send, err.status, err.headers())
    await send({"type": BODY, "body": err.body(), "more_body": False})


async def fail(
    req: Request, send: Send, err: RelayError | Ending | Refusal, phase: str | None
) -> None:
    """The request ended with ``err`` in ``phase``: settle it (``Request.settle``: its
    outcome, recorded on the event unless one was settled before), then answer the settled
    outcome: the relay's one answer path for every failure and refusal.
    Once the server has refused the request (``ClientConn.refusal``: it answered 408, 503,
    ... itself), that refusal is the outcome, whatever the relay found after it."""
    refused = req.conn.refusal if req.conn is not None else None
    await send_error(req, send, req.settle(err if refused is None else refused, phase))
