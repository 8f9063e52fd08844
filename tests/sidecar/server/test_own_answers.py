"""The server's own answers go out as outcomes (issue 58): an app that fails or returns
before answering gets the ``Internal`` outcome's 500 and JSON body, as any other failure the
sidecar answers, on the sidecar's own server (``RelayServer``, in a thread)."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest

from obs.sidecar.types import Receive, Scope, Send
from tests.support.inproc import served_app
from tests.support.rawhttp import exchange, status

pytestmark = pytest.mark.inproc


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    """/health answers (the fixture waits on it); /fail raises; anything else returns."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/fail":
        raise KeyError("a bug")
    if scope["path"] == "/health":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def served() -> Iterator[int]:
    with served_app(_app, "/health") as port:
        yield port


@pytest.mark.parametrize("path", ["/fail", "/silent"])
def test_an_app_without_an_answer_gets_the_internal_outcome(served: int, path: str) -> None:
    """A raising app and one that returns unanswered: 500, the OpenAI error body of the
    sidecar's own fault (no cause shown), and the connection closed."""
    answer = exchange(served, b"GET %b HTTP/1.1\r\nhost: x\r\n\r\n" % path.encode())
    assert status(answer) == 500
    head, body = answer.split(b"\r\n\r\n", 1)
    assert b"content-type: application/json" in head.lower()
    error = orjson.loads(body)["error"]
    assert (error["type"], error["code"]) == ("InternalServerError", 500)
    assert error["message"] == "internal error in the sidecar"
