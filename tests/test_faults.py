"""Faults: a replica killed or frozen mid-stream, upstream timeouts, the sidecar stopped.

Every fault must end with a well-formed answer or a clean stream error for the
client (an SSE error frame, then ``[DONE]``), one event with the right status,
error class and phase, the right counters, and no stuck tasks or leaked
connections (the in-flight gauge back to 0, a prompt clean exit on SIGTERM, no
socket left open to a dead replica).

Replicas are real ``vllm serve`` processes: the session engine (``vllm``) and a
spare one started for this module, which tests freeze (SIGSTOP) and kill
(SIGKILL); it is restarted when a test finds it dead.

vLLM's API server on a loaded 2-core machine sometimes holds a whole stream and
delivers it in one burst when generation ends. A fault injected "mid-stream"
then lands after the stream is complete; those attempts are retried.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
import yaml

from obs import conventions as c
from obs.engine import EnginePaths, ServerError, VllmServer
from obs.sidecar.testing import SidecarProcess

from .conftest import SidecarFactory
from .probes import DONE_FRAME, is_error_frame, metric, samples, sse_frames, tcp_sockets

pytestmark = pytest.mark.engine

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


@pytest.fixture(scope="module")
def spare_engine(
    engine_paths: EnginePaths, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """A second real engine for this module's faults (started on first use)."""
    server = VllmServer(
        engine_paths.model_dir,
        max_model_len=4096,
        kv_cache_bytes=64 << 20,
        log_path=tmp_path_factory.mktemp("spare") / "vllm.log",
        python=engine_paths.python,
        launcher=engine_paths.launcher,
    )
    yield server
    server.stop()


def _running(server: VllmServer) -> bool:
    try:
        return server.poll() is None
    except ServerError:  # never started
        return False


@pytest.fixture
def spare(spare_engine: VllmServer) -> Iterator[VllmServer]:
    """The spare engine, running; thawed after the test whatever happened."""
    if not _running(spare_engine):
        spare_engine.start()
    yield spare_engine
    if _running(spare_engine):
        spare_engine.resume()


def _answered(sc: SidecarProcess) -> str:
    """One short non-streamed request through ``sc`` that must succeed; its request id."""
    rid = uuid.uuid4().hex
    r = httpx.post(
        sc.url + CHAT, json=chat(4, stream=False), headers={"x-request-id": rid}, timeout=60
    )
    assert r.status_code == 200, r.content
    return rid


class Stream:
    """A streamed request read on a thread: frames as they come, the body at the end."""

    def __init__(self, url: str, body: dict[str, Any], request_id: str | None = None) -> None:
        self.request_id = request_id or uuid.uuid4().hex
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
    deadline = time.monotonic() + timeout_s
    while True:
        mine = [e for e in sc.events() if e["request_id"] == request_id]
        if mine or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(mine) == 1, f"{len(mine)} events for {request_id}"
    return mine[0]


# uvicorn re-raises the signal it stopped on, after a complete graceful shutdown.
GRACEFUL = (0, -signal.SIGTERM)


def assert_exits_promptly(sc: SidecarProcess) -> None:
    """Nothing left in flight or queued; SIGTERM then ends the sidecar at once, cleanly."""
    for gauge in ("vllm_obs_in_flight_requests", "vllm_obs_queued_requests"):
        wait_until(lambda g=gauge: metric(sc.url, g) == 0, 5, f"{gauge} back to 0")
    t0 = time.monotonic()
    rc = sc.stop()
    took = time.monotonic() - t0
    log = sc.log_tail(1 << 20)
    assert rc in GRACEFUL and "Application shutdown complete" in log, log[-3000:]
    assert took < 5, f"SIGTERM took {took:.1f} s: something held the shutdown"
    assert "Cancel" not in log, "tasks were still running at shutdown"


def wait_until(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def vllm_running(server: VllmServer) -> float:
    return metric(server.url, "vllm:num_requests_running")


# ---- upstream timeouts (a frozen replica) -----------------------------------------------


def test_frozen_replica_times_out_at_first_token_deadline(
    spare: VllmServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """No first token within first_token_s: 504 JSON error at that deadline, not idle_s."""
    config = write_config(tmp_path / "lanes.yaml", [spare.url], first_token_s=1, idle_s=6)
    sc = sidecar(config=config, traces=False, args=("--pool-poll-interval", "60"))
    spare.pause()
    try:
        rid = uuid.uuid4().hex
        t0 = time.monotonic()
        r = httpx.post(sc.url + CHAT, json=chat(8), headers={"x-request-id": rid}, timeout=30)
        took = time.monotonic() - t0
    finally:
        spare.resume()
    assert r.status_code == 504, r.content
    assert r.json()["error"]["type"] == "GatewayTimeoutError"
    assert took < 4, f"the first-token timeout (1 s) fired after {took:.1f} s"
    ev = event_of(sc, rid)
    assert (ev["status"], ev["error_class"], ev["error_phase"], ev["http_status"]) == (
        "error",
        "upstream_timeout",
        "prefill",
        504,
    )
    labels = {"lane": "default", "pool": "main"}
    assert metric(
        sc.url, "vllm_obs_upstream_errors_total", **labels, error_class="upstream_timeout"
    )
    assert metric(sc.url, "vllm_obs_requests_total", **labels, outcome=c.ERROR) == 1
    # Thawed, the replica serves the next request through the same sidecar.
    assert httpx.post(sc.url + CHAT, json=chat(4, stream=False), timeout=60).status_code == 200
    assert_exits_promptly(sc)


def test_replica_frozen_mid_stream_ends_stream_at_idle_timeout(
    spare: VllmServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """A replica that stops sending mid-stream: error frame after idle_s, event says timeout."""
    config = write_config(tmp_path / "lanes.yaml", [spare.url], first_token_s=15, idle_s=1.5)
    sc = sidecar(config=config, traces=False, args=("--pool-poll-interval", "60"))
    for _attempt in range(3):
        stream = Stream(sc.url + CHAT, chat(LONG))
        assert stream.first_output.wait(60)
        spare.pause()
        frozen = time.monotonic()
        try:
            stream.wait(60)
            ended = time.monotonic() - frozen
        finally:
            spare.resume()
        if not stream.finished_normally:
            break
    else:
        pytest.fail("vLLM delivered every stream whole before it could be frozen")
    error = assert_clean_stream_error(stream)
    assert "idle" in error["message"]
    assert ended < 5, f"the idle timeout (1.5 s) ended the stream after {ended:.1f} s"
    ev = event_of(sc, stream.request_id)
    assert (ev["status"], ev["error_class"], ev["error_phase"], ev["http_status"]) == (
        "error",
        "upstream_timeout",
        "decode",
        200,
    )
    assert ev["output_chunks"] >= 1 and ev["ttft_ms"] is not None
    labels = {"lane": "default", "pool": "main", "error_class": "upstream_timeout"}
    assert metric(sc.url, "vllm_obs_upstream_errors_total", **labels) == 1
    # The timed-out request's connection is closed, so the thawed engine aborts it.
    wait_until(lambda: vllm_running(spare) == 0, 10, "vLLM to abort the timed-out request")
    assert httpx.post(sc.url + CHAT, json=chat(4, stream=False), timeout=60).status_code == 200
    assert_exits_promptly(sc)


def test_replica_late_on_one_poll_keeps_its_health_and_engine_state(
    vllm: VllmServer, spare: VllmServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """A replica that answers one or two polls late (busy) stays up, with its last KV reading."""
    config = write_config(tmp_path / "lanes.yaml", [spare.url, vllm.url], first_token_s=5)
    sc = sidecar(config=config, traces=False, args=("--pool-poll-interval", "1"))
    up = {"pool": "main", "replica": spare.url}
    wait_until(lambda: metric(sc.url, "vllm_obs_pool_up", **up) == 1, 10, "spare up")
    seen: list[tuple[float, bool]] = []
    spare.pause()  # 1.5 s: at most two polls (1 s timeout, then 1 s apart) answer late
    try:
        paused = time.monotonic()
        while time.monotonic() - paused < 1.5:
            kv = samples(sc.url).get("vllm_obs_pool_kv_cache_usage_ratio", [])
            pool_up = metric(sc.url, "vllm_obs_pool_up", **up)
            seen.append((pool_up, any(lb.get("replica") == spare.url for lb, _ in kv)))
            time.sleep(0.1)
    finally:
        spare.resume()
    time.sleep(2.5)  # the polls after the thaw
    seen.append((metric(sc.url, "vllm_obs_pool_up", **up), True))
    assert len(seen) > 5 and all(pool_up == 1 and kv for pool_up, kv in seen), seen
    assert httpx.get(sc.url + "/health").json()["pools"]["main"][spare.url] is True


def test_frozen_replica_leaves_the_pool_until_it_thaws(
    vllm: VllmServer, spare: VllmServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """A replica that stops answering health polls gets no traffic; back when it answers."""
    config = write_config(tmp_path / "lanes.yaml", [spare.url, vllm.url], first_token_s=5)
    sc = sidecar(config=config, traces=False, args=("--pool-poll-interval", "0.5"))

    def healthy() -> dict[str, bool]:
        pools: dict[str, bool] = httpx.get(sc.url + "/health").json()["pools"]["main"]
        return pools

    wait_until(lambda: all(healthy().values()), 10, "both replicas healthy")
    spare.pause()
    try:
        wait_until(lambda: not healthy()[spare.url], 10, "the frozen replica marked down")
        assert httpx.get(sc.url + "/health").json()["status"] == "ok"  # one replica is enough
        rids = [_answered(sc) for _ in range(3)]
        assert {event_of(sc, rid)["replica"] for rid in rids} == {vllm.url}
        up = {"pool": "main", "replica": spare.url}
        assert metric(sc.url, "vllm_obs_pool_up", **up) == 0
    finally:
        spare.resume()
    wait_until(lambda: healthy()[spare.url], 15, "the thawed replica marked up")
    rid = uuid.uuid4().hex
    r = httpx.post(
        sc.url + CHAT, json=chat(4, stream=False), headers={"x-request-id": rid}, timeout=30
    )
    assert r.status_code == 200 and event_of(sc, rid)["replica"] == spare.url
    assert all(e["status"] == "ok" for e in sc.events())
    assert_exits_promptly(sc)


@pytest.fixture
def unaccepting_replica() -> Iterator[str]:
    """A real listening socket whose accept queue is full: connects to it hang (SYN dropped).

    What a replica host looks like when its server stops accepting (a wedged process,
    a full backlog): the kernel, not a fake server, produces the fault.
    """
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port))  # fills the queue of one
    yield f"http://127.0.0.1:{port}"
    filler.close()
    listener.close()


def test_replica_not_accepting_times_out_at_connect_and_fails_over(
    vllm: VllmServer, unaccepting_replica: str, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """A connect timeout is a connection failure: replica marked down, request fails over."""
    replicas = [unaccepting_replica, vllm.url]
    config = write_config(tmp_path / "lanes.yaml", replicas, connect_s=0.5)
    sc = sidecar(config=config, traces=False, args=("--pool-poll-interval", "60"))
    rid = uuid.uuid4().hex
    r = httpx.post(
        sc.url + CHAT, json=chat(4, stream=False), headers={"x-request-id": rid}, timeout=30
    )
    assert r.status_code == 200, r.content
    ev = event_of(sc, rid)
    assert (ev["status"], ev["replica"]) == ("ok", vllm.url)
    health = httpx.get(sc.url + "/health").json()["pools"]["main"]
    assert health == {unaccepting_replica: False, vllm.url: True}
    assert_exits_promptly(sc)


# ---- the sidecar stopped under load -----------------------------------------------------


def test_sigterm_lets_in_flight_streams_finish_refuses_new_and_flushes_events(
    vllm: VllmServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """SIGTERM: streams in flight run to [DONE], new connections are refused, all logged."""
    config = write_config(tmp_path / "lanes.yaml", [vllm.url])
    sc = sidecar(config=config, traces=False, args=("--shutdown-grace", "30"))
    streams = [Stream(sc.url + CHAT, chat(600)) for _ in range(4)]
    for s in streams:
        assert s.first_output.wait(60)
    os.kill(sc.pid, signal.SIGTERM)
    refused = False
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not refused:
        try:
            httpx.post(sc.url + CHAT, json=chat(2, stream=False), timeout=30)
        except httpx.ConnectError:
            refused = True
        except httpx.ReadError:
            # Raced the listener closing: the connection sat in the accept backlog and the
            # kernel reset it unanswered. Not served either: refused as well.
            refused = True
        time.sleep(0.02)
    assert refused, "the sidecar kept accepting connections after SIGTERM"
    for s in streams:
        s.wait(60)
        assert s.error is None and s.finished_normally, s.body[-300:]
    assert sc.proc is not None and sc.proc.wait(30) in GRACEFUL
    events = {e["request_id"]: e for e in sc.events()}
    for s in streams:
        ev = events[s.request_id]
        assert (ev["status"], ev["finish_reason"], ev["completion_tokens"]) == ("ok", "length", 600)
    # Requests the sidecar accepted before it stopped listening were answered and logged too.
    assert all(e["status"] == "ok" for e in events.values())


def test_sigterm_past_grace_ends_streams_with_error_and_logs_them(
    spare: VllmServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """A stream still running when the grace period ends: error frame, event says so."""
    config = write_config(tmp_path / "lanes.yaml", [spare.url])
    for _attempt in range(3):
        sc = sidecar(config=config, traces=False, args=("--shutdown-grace", "1"))
        stream = Stream(sc.url + CHAT, chat(LONG))
        assert stream.first_output.wait(60)
        os.kill(sc.pid, signal.SIGTERM)
        stream.wait(30)
        assert sc.proc is not None and sc.proc.wait(30) in GRACEFUL
        if not stream.finished_normally:
            break
    else:
        pytest.fail("vLLM delivered every stream whole within the grace period")
    error = assert_clean_stream_error(stream)
    assert "shut" in error["message"]
    ev = event_of(sc, stream.request_id)
    assert ev["status"] == c.ERROR, ev
    assert ev["error_class"] and ev["error_phase"] == "decode", ev
    # The stream's upstream connection was closed: vLLM stops generating for nobody.
    wait_until(lambda: vllm_running(spare) == 0, 5, "vLLM to abort the cut stream")


def test_sigkill_of_the_sidecar_loses_only_requests_in_flight(
    spare: VllmServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """SIGKILL: finished requests are all on disk as whole lines; in-flight ones are lost."""
    config = write_config(tmp_path / "lanes.yaml", [spare.url])
    for _attempt in range(3):
        sc = sidecar(config=config, traces=False)
        done = [_answered(sc) for _ in range(5)]
        time.sleep(0.5)  # the writer thread writes within milliseconds of the response
        streams = [Stream(sc.url + CHAT, chat(LONG)) for _ in range(2)]
        for s in streams:
            assert s.first_output.wait(60)
        sc.kill()
        for s in streams:
            s.wait(30)
        # The client sees its connection drop mid-body (no error frame: nobody is left to send
        # it). A stream vLLM delivered whole before the kill (its API server fell behind its
        # engine on this loaded machine) was not in flight: try again.
        cut = [s for s in streams if s.error is not None or not s.body.endswith(DONE_FRAME)]
        if cut:
            break
    else:
        pytest.fail("vLLM delivered every stream whole before the sidecar was killed")
    assert sc.events_path is not None
    raw = sc.events_path.read_bytes()
    assert raw.endswith(b"\n")  # whole lines only
    ids = [e["request_id"] for e in sc.events()]
    assert ids[: len(done)] == done
    # Beyond the finished requests, at most the streams that ended before the kill.
    assert set(ids[len(done) :]) <= {s.request_id for s in streams if s not in cut}
    # The kernel closed the sidecar's upstream sockets: vLLM aborts the orphaned streams.
    wait_until(lambda: vllm_running(spare) == 0, 5, "vLLM to abort the orphaned streams")


# ---- a replica killed mid-stream (last: it leaves the spare engine dead) -----------------


def test_replica_killed_mid_stream_ends_stream_cleanly_then_fails_over(
    vllm: VllmServer, spare: VllmServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """SIGKILL of the serving replica: clean stream error, event, counter; then failover."""
    config = write_config(tmp_path / "lanes.yaml", [spare.url, vllm.url])
    for _attempt in range(2):
        if not _running(spare):
            spare.start()
        sc = sidecar(config=config, traces=False, args=("--pool-poll-interval", "60"))
        client = openai.OpenAI(base_url=sc.url + "/v1", api_key="x", max_retries=0)
        rid = uuid.uuid4().hex
        chunks = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "def main():"}],
            max_tokens=LONG,
            stream=True,
            extra_body={"ignore_eos": True},
            extra_headers={"x-request-id": rid},
        )
        got: list[str] = []
        raised: openai.APIError | None = None
        try:
            for chunk in chunks:
                if chunk.choices and chunk.choices[0].delta.content:
                    got.append(chunk.choices[0].delta.content)
                    if len(got) == 1:
                        spare.kill()
        except openai.APIError as e:  # the clean way for a stream to fail: an error frame
            raised = e
        if raised is not None:
            break
        sc.stop()
    else:
        pytest.fail("vLLM delivered every stream whole before the replica could be killed")
    assert got and "failed" in raised.message
    ev = event_of(sc, rid)
    assert (ev["status"], ev["error_class"], ev["error_phase"], ev["http_status"]) == (
        "error",
        "upstream_protocol",
        "decode",
        200,
    )
    assert ev["replica"] == spare.url and ev["output_chunks"] >= 1
    labels = {"lane": "default", "pool": "main"}
    errors = metric(
        sc.url, "vllm_obs_upstream_errors_total", **labels, error_class="upstream_protocol"
    )
    assert errors == 1
    # The dead replica refuses connections: the next request goes to the other one.
    rid2 = uuid.uuid4().hex
    answer = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        extra_headers={"x-request-id": rid2},
    )
    assert answer.choices[0].message.content is not None
    ev2 = event_of(sc, rid2)
    assert (ev2["status"], ev2["replica"]) == ("ok", vllm.url)
    assert metric(sc.url, "vllm_obs_requests_total", **labels, outcome=c.OK) == 1
    health = httpx.get(sc.url + "/health").json()
    assert health["status"] == "ok" and health["pools"]["main"] == {
        spare.url: False,
        vllm.url: True,
    }
    assert tcp_sockets(sc.pid, spare.port) == []  # nothing left open to the dead replica
    assert_exits_promptly(sc)
