"""The sidecar's own answers (``/health``, ``/metrics``, ``/v1/models``, 404, 405): a body,
a status and headers, sent whole with their length.

Why not a web framework: these three GET routes and two errors are all the sidecar answers
itself (the relayed routes go to the relay on the same server), and FastAPI's import alone
took 155 of the ~480 ms a sidecar took to import on this project's 2-core machine.
"""

from __future__ import annotations

from obs.sidecar.endings import Ending, outcome
from obs.sidecar.outcomes import Refusal, RelayError
from obs.sidecar.types import Send


class Answer:
    """One answer: its body, status and headers (``content-type`` JSON unless told)."""

    __slots__ = ("body", "headers", "status")

    def __init__(
        self,
        body: bytes,
        status: int = 200,
        *,
        content_type: bytes = b"application/json",
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        self.body, self.status = body, status
        self.headers = headers if headers is not None else [(b"content-type", content_type)]

    async def send(self, send: Send) -> None:
        """The whole answer, as ASGI messages: the head with the body's length, then the body."""
        head = [(b"content-length", b"%d" % len(self.body)), *self.headers]
        await send({"type": "http.response.start", "status": self.status, "headers": head})
        await send({"type": "http.response.body", "body": self.body, "more_body": False})


def error_answer(ended: RelayError | Refusal | Ending) -> Answer:
    """The sidecar's own error: status, body and headers from its outcome
    (``obs.sidecar.endings.outcome`` of a refusal or an ending)."""
    err = ended if isinstance(ended, RelayError) else outcome(ended)
    return Answer(err.body(), err.status, headers=err.headers())
