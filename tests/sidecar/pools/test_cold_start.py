"""Cold starts: a replica that refuses its first polls and then comes up is counted
(``vllm_obs_pool_cold_starts_total``), with the seconds from its first failure to its first
healthy poll and to the first token it served (``vllm_obs_pool_cold_start_seconds``).

The replica is a fake in this process (``LateReplica``, an idle pool's ``/metrics`` and a
one-token chat answer), started when the test chooses: a real vLLM takes tens of seconds to
start on this CPU, and what is measured is the sidecar's bookkeeping of a replica that
refuses, then answers. A real replica's restart is in tests/engines/test_served_restart.py.
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

ANSWER = chat_answer("up", "tiny")
DOWN_S = 1.0


class LateReplica:
    """A fake replica on a port chosen now, listening only once ``start()`` is called."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, body: bytes) -> None:
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._send(b"" if self.path == "/metrics" else b'{"object":"list","data":[]}')

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self._send(orjson.dumps(ANSWER))

            def log_message(self, *args: object) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


@pytest.fixture(scope="module")
def late() -> Iterator[LateReplica]:
    replica = LateReplica()
    yield replica
    replica.stop()


@pytest.fixture(scope="module")
def sidecar(late: LateReplica, inproc: InprocFactory) -> InProcessSidecar:
    config = parse_config(
        {
            "pools": [{"name": "gpu", "replicas": [late.url]}],
            "lanes": [{"name": "main", "pool": "gpu"}],
            "default_lane": "main",
        },
        "<cold>",
    )
    return inproc(config, pool_poll_interval_s=0.2)


def _cold(sc: InProcessSidecar) -> tuple[float | None, dict[str, float]]:
    samples = sc.samples()
    count = [v for _, v in samples.get(c.POOL_COLD_STARTS.series[0], [])]
    stages = {lb[c.STAGE]: v for lb, v in samples.get(c.POOL_COLD_START.name, [])}
    return (count[0] if count else None), stages


def test_a_replica_coming_up_is_a_cold_start_to_health_then_first_token(
    sidecar: InProcessSidecar, late: LateReplica
) -> None:
    """Down for ~1 s, then up: one cold start, healthy after >= 1 s; the first answer it
    serves sets first_token, no earlier than healthy; a second answer changes nothing."""
    time.sleep(DOWN_S)
    assert _cold(sidecar) == (None, {})  # still down: no cold start yet
    late.start()
    deadline = time.monotonic() + 10
    while _cold(sidecar)[0] is None:
        assert time.monotonic() < deadline, sidecar.metrics()
        time.sleep(0.05)
    count, stages = _cold(sidecar)
    assert count == 1 and set(stages) == {"healthy"}
    assert DOWN_S <= stages["healthy"] < DOWN_S + 5
    for i in range(2):
        resp = httpx.post(
            sidecar.url + "/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
            timeout=10,
        )
        assert resp.status_code == 200, resp.text
        if i == 0:
            first = _cold(sidecar)[1]["first_token"]
            assert stages["healthy"] <= first < stages["healthy"] + 5
    assert _cold(sidecar) == (1, {"healthy": stages["healthy"], "first_token": first})
