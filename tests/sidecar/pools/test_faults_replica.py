"""Faults of a replica: killed or frozen mid-stream, late, not accepting; upstream timeouts.

Every fault must end with a well-formed answer or a clean stream error for the
client (an SSE error frame, then ``[DONE]``), one event with the right status,
error class and phase, the right counters, and no stuck tasks or leaked
connections (the in-flight gauge back to 0, a prompt clean exit on SIGTERM, no
socket left open to a dead replica).

Replicas are real ``vllm serve`` processes: the session engine (``vllm``) and a
spare one (``spare``, tests/conftest.py), which tests freeze (SIGSTOP) and kill
(SIGKILL); it is restarted when a test finds it dead.

vLLM's API server on a loaded 2-core machine sometimes holds a whole stream and
delivers it in one burst when generation ends. A fault injected "mid-stream"
then lands after the stream is complete; those attempts are retried.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from obs import conventions as c
from obs.engines.server import VllmServer
from tests.conftest import SidecarFactory
from tests.support.faults_support import (
    CHAT,
    LONG,
    Stream,
    answered,
    assert_clean_stream_error,
    assert_exits_promptly,
    chat,
    event_of,
    running,
    vllm_running,
    wait_until,
    write_config,
)
from tests.support.probes import metric, samples, tcp_sockets

pytestmark = pytest.mark.engine


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
        rids = [answered(sc) for _ in range(3)]
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


# ---- a replica killed mid-stream (last: it leaves the spare engine dead) -----------------


@pytest.mark.ends_engine("spare")
def test_replica_killed_mid_stream_ends_stream_cleanly_then_fails_over(
    vllm: VllmServer,
    spare: VllmServer,
    sidecar: SidecarFactory,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """SIGKILL of the serving replica: clean stream error, event, counter; then failover."""
    config = write_config(tmp_path / "lanes.yaml", [spare.url, vllm.url])
    for _attempt in range(2):
        if not running(spare):
            spare.start()
        sc = sidecar(config=config, traces=False, args=("--pool-poll-interval", "60"))
        client = openai.OpenAI(base_url=sc.url + "/v1", api_key="x", max_retries=0)
        # Closed after the test: the stream cut by the kill leaves its socket in the client's
        # pool, and one left for pytest's last collection fails the session (ResourceWarning).
        request.addfinalizer(client.close)
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
