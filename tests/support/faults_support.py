"""What the fault suites share (tests/sidecar/test_faults_*.py):
request bodies, a lanes config over the engines, a stream read on its own thread, and the
checks every fault must pass."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from obs.engines.server import ServerError, VllmServer
from obs.sidecar.testing import SidecarProcess
from tests.support.probes import DONE_FRAME, is_error_frame, metric, sse_frames

CHAT = "/v1/chat/completions"
LONG = 3800  # tokens: several seconds of streaming on the spare engine (max_model_len 4096)


def chat(max_tokens: int, *, stream: bool = True) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": "def main():"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }


def write_config(
    path: Path,
    replicas: list[str],
    *,
    connect_s: float = 10,
    first_token_s: float = 30,
    idle_s: float = 30,
) -> Path:
    """One pool ``main`` of ``replicas`` and one lane ``default`` with these timeouts.

    The connect timeout is generous by default: on a CPU-starved machine the sidecar's
    event loop can run its timer before it sees the (long established) connection.
    """
    config = {
        "version": 1,
        "pools": [{"name": "main", "replicas": replicas, "model": "tiny"}],
        "lanes": [
            {
                "name": "default",
                "pool": "main",
                "timeouts": {
                    "connect_s": connect_s,
                    "first_token_s": first_token_s,
                    "idle_s": idle_s,
                },
            }
        ],
        "default_lane": "default",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def running(server: VllmServer) -> bool:
    try:
        return server.poll() is None
    except ServerError:  # never started
        return False


def answered(sc: SidecarProcess) -> str:
    """One short non-streamed request through ``sc`` that must succeed; its request id."""
    rid = uuid.uuid4().hex
    r = httpx.post(
        sc.url + CHAT, json=chat(4, stream=False), headers={"x-request-id": rid}, timeout=60
    )
    assert r.status_code == 200, r.content
    return rid


class Stream:
    """A streamed request read on a thread: frames as they come, the body at the end.
    ``on_data`` is called after each read (``Throttle.read``: the engine runs in step)."""

    def __init__(
        self,
        url: str,
        body: dict[str, Any],
        request_id: str | None = None,
        on_data: Callable[[], None] = lambda: None,
    ) -> None:
        self.request_id = request_id or uuid.uuid4().hex
        self._on_data = on_data
        self._buf = bytearray()  # not bytes +=: quadratic copying would starve the test thread
        self.status: int | None = None
        self.error: BaseException | None = None
        self.first_output = threading.Event()
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(url, body), daemon=True)
        self._thread.start()

    def _run(self, url: str, body: dict[str, Any]) -> None:
        headers = {"x-request-id": self.request_id}
        try:
            with httpx.stream("POST", url, json=body, headers=headers, timeout=120) as r:
                self.status = r.status_code
                for data in r.iter_raw():
                    self._buf += data
                    if b'"content":"' in data.replace(b'"content":""', b""):
                        self.first_output.set()
                    self._on_data()
        except httpx.HTTPError as e:
            self.error = e
        finally:
            self.first_output.set()
            self.done.set()

    def wait(self, timeout_s: float = 60) -> Stream:
        assert self.done.wait(timeout_s), "the stream never ended"
        return self

    @property
    def body(self) -> bytes:
        return bytes(self._buf)

    @property
    def frames(self) -> list[bytes]:
        return sse_frames(self.body)

    @property
    def finished_normally(self) -> bool:
        """Ended with [DONE] and no error frame: the fault came too late to matter."""
        return self.body.endswith(DONE_FRAME) and not any(is_error_frame(f) for f in self.frames)


def assert_clean_stream_error(stream: Stream) -> dict[str, Any]:
    """The client got 200, then the pool's frames, then an error frame and ``[DONE]``."""
    assert stream.error is None, f"the stream broke instead of ending cleanly: {stream.error!r}"
    assert stream.status == 200
    assert stream.body.endswith(DONE_FRAME), stream.body[-300:]
    frames = stream.frames
    assert is_error_frame(frames[-2]), frames[-2][:300]
    error: dict[str, Any] = orjson.loads(frames[-2][6:])["error"]
    assert "Traceback" not in error["message"]
    return error


def event_of(sc: SidecarProcess, request_id: str, timeout_s: float = 10) -> dict[str, Any]:
    """The one event of ``request_id``."""
    mine = sc.events_of(request_id, timeout_s)
    assert len(mine) == 1, f"{len(mine)} events for {request_id}"
    return mine[0]


# The sidecar re-raises the signal it stopped on, after a complete graceful shutdown.
GRACEFUL = (0, -signal.SIGTERM)


def assert_exits_promptly(sc: SidecarProcess) -> None:
    """Nothing left in flight or queued; SIGTERM then ends the sidecar by the clean path:
    graceful exit, stopped logged, no request cut at the end of the grace, no task cancelled
    (the stop's 120 s are a hang guard, not a bound on how fast it stops)."""
    for gauge in ("vllm_obs_in_flight_requests", "vllm_obs_queued_requests"):
        wait_until(lambda g=gauge: metric(sc.url, g) == 0, 60, f"{gauge} back to 0")
    rc = sc.stop(timeout_s=120)
    log = sc.log_tail(1 << 20)
    assert rc in GRACEFUL and "sidecar_stopped" in log, log[-3000:]
    assert "shutdown_grace_ended" not in log, "requests were still running at shutdown"
    assert "Cancel" not in log, "tasks were still running at shutdown"


def wait_until(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def vllm_running(server: VllmServer) -> float:
    return metric(server.url, "vllm:num_requests_running")
