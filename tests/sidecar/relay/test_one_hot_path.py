"""One hot path: the relay runs on the sidecar's own server, and says so to any other.

The app is called as another ASGI server would call it (a scope without the client
connection the sidecar's server hands over): no real server can be made to omit it.
"""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from obs import conventions as c
from obs.config import single_upstream
from obs.exporters.memory import InMemoryExporter
from obs.sidecar.app import create_app
from obs.sidecar.relay.relay import NO_CONNECTION
from obs.sidecar.settings import Settings
from tests.support.probes import CHAT


def test_a_request_without_the_client_connection_is_refused_and_recorded() -> None:
    """Under another ASGI server the relayed route answers 500 naming why, and the event
    records the same outcome (internal), instead of relaying on a second path."""
    memory = InMemoryExporter()
    settings = Settings(config=single_upstream("http://127.0.0.1:9"), events_path=None)
    app = create_app(settings, registry=CollectorRegistry(), exporters=[memory])
    sent: list[MutableMapping[str, Any]] = []
    scope = {
        "type": "http", "method": "POST", "path": CHAT, "headers": [(b"x-request-id", b"r1")],
        "client": ("127.0.0.1", 1), "http_version": "1.1",
    }  # fmt: skip

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 500
    assert orjson.loads(sent[1]["body"])["error"]["type"] == "InternalServerError"
    ev = memory.event("r1", timeout_s=0)
    assert (ev["status"], ev["error_class"], ev["http_status"]) == (c.ERROR, "internal", 500)
    assert NO_CONNECTION in ev["error_message"]
