"""A fallback pool that is a hosted OpenAI-compatible API, with no ``/metrics``: marked
``metrics: false``, it is probed on its ``health.path`` and reads as up; a lane whose own pool
is down falls back to it; the same replica polled for ``/metrics`` reads as down.

The hosted API is a fake in this process (``HostedApi``): a real hosted API cannot be reached
from the test machine (no network), and no engine here serves the OpenAI API without a
``/metrics`` page and with a key on every path. It answers ``/v1/models`` and
``/v1/chat/completions`` as OpenAI does (401 without ``Authorization: Bearer KEY``) and 404
on ``/metrics``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import orjson
import pytest

from obs import conventions as c
from obs.config import parse_config
from obs.procs import free_port
from tests.sidecar.conftest import InprocFactory
from tests.support import chat_answer
from tests.support.inproc import InProcessSidecar
from tests.support.probes import refused_url

KEY = "sk-hosted-test"
KEY_ENV = "VLLM_OBS_TEST_HOSTED_KEY"
ANSWER = chat_answer("hi", "hosted-model")


class HostedApi:
    """A fake hosted OpenAI-compatible API on 127.0.0.1 (see the module doc for why)."""

    def __init__(self) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.gets: list[str] = []

        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, status: int, body: object) -> None:
                data = orjson.dumps(body)
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                return self.headers.get("authorization") == f"Bearer {KEY}"

            def do_GET(self) -> None:
                api.gets.append(self.path)
                if self.path != "/v1/models":
                    self._send(
                        404, {"error": {"message": "not found", "type": "invalid_request_error"}}
                    )
                elif not self._authorized():
                    self._send(
                        401, {"error": {"message": "no key", "type": "invalid_request_error"}}
                    )
                else:
                    self._send(200, {"object": "list", "data": [{"id": "hosted-model"}]})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.path == "/v1/chat/completions" and self._authorized():
                    self._send(200, ANSWER)
                else:
                    self._send(
                        401, {"error": {"message": "no key", "type": "invalid_request_error"}}
                    )

            def log_message(self, *args: object) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", int(self.url.rsplit(":", 1)[1])), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> HostedApi:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture(scope="module")
def hosted() -> Iterator[HostedApi]:
    with HostedApi() as api:
        yield api


@pytest.fixture(scope="module")
def sidecar(
    hosted: HostedApi, inproc: InprocFactory, monkeypatch_module: pytest.MonkeyPatch
) -> Iterator[InProcessSidecar]:
    """Lane ``main`` on a dead local pool, falling back to the hosted API (``metrics: false``,
    probed on /v1/models, its key from the environment); pool ``polled`` is the same API
    without ``metrics: false``."""
    monkeypatch_module.setenv(KEY_ENV, KEY)
    with refused_url() as dead:
        config = parse_config(
            {
                "pools": [
                    {"name": "local", "replicas": [dead]},
                    {
                        "name": "hosted",
                        "replicas": [hosted.url],
                        "metrics": False,
                        "health": {"path": "/v1/models"},
                        "api_key_env": KEY_ENV,
                        "model": "hosted-model",
                    },
                    {"name": "polled", "replicas": [hosted.url], "api_key_env": KEY_ENV},
                ],
                "lanes": [
                    {"name": "main", "pool": "local", "fallback": "hosted"},
                    {"name": "other", "pool": "polled", "match": [{"header": {"x-lane": "o"}}]},
                ],
                "default_lane": "main",
            },
            "<hosted>",
        )
        yield inproc(config, pool_poll_interval_s=0.2)


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _up(sc: InProcessSidecar) -> dict[str, float]:
    return {
        labels[c.POOL]: value
        for labels, value in sc.samples().get(c.POOL_UP.name, [])
        if c.POOL in labels
    }


def test_a_pool_without_metrics_is_probed_and_reads_up(
    sidecar: InProcessSidecar, hosted: HostedApi
) -> None:
    """pool_up is 1 for the hosted pool (its probe of /v1/models answers 401 without a key:
    up) and 0 for the same API polled for /metrics (404) and for the dead local pool."""
    deadline = time.monotonic() + 10
    while _up(sidecar).get("hosted") != 1.0 or _up(sidecar).get("polled") != 0.0:
        assert time.monotonic() < deadline, _up(sidecar)
        time.sleep(0.1)
    assert _up(sidecar)["local"] == 0.0
    assert "/v1/models" in hosted.gets


def test_a_lane_falls_back_to_the_hosted_pool(sidecar: InProcessSidecar) -> None:
    """The lane's own pool refuses connections: the hosted pool answers with the pool's key."""
    resp = httpx.post(
        sidecar.url + "/v1/chat/completions",
        json={"model": "hosted-model", "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-request-id": "fb-1"},
        timeout=10,
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] == "hi"
    event = sidecar.event("fb-1")
    assert (event["status"], event["pool"]) == (c.OK, "hosted")
