"""Faults of a replica: killed or frozen mid-stream, late, not accepting; upstream timeouts.

Every fault must end with a well-formed answer or a clean stream error for the
client (an SSE error frame, then ``[DONE]``), one event with the right status,
error class and phase, the right counters, and no stuck tasks or leaked
connections (the in-flight gauge back to 0, a prompt clean exit on SIGTERM, no
socket left open to a dead replica).

Replicas are real ``vllm serve`` processes: the session engine (``vllm``) and a
spare one (``spare``, tests/conftest.py), which tests freeze (SIGSTOP) and kill
(SIGKILL); it is restarted when a test finds it dead.

A fault injected "mid-stream" lands mid-stream on any machine: the spare's engine core
runs in step with the reader and is frozen before the fault (tests.support.engine_core), so
vLLM cannot have finished the answer, however its API server batches it.
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
from tests.support.engine_core import engine_core_throttled
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
    """No first token within first_token_s: 504 JSON error at that deadline, not idle_s.

    Which deadline answered is judged by the answer and the event, not the clock: the
    message names first_token_s, the phase is prefill, and idle_s is 300 s, past the
    client's 60 s hang guard."""
    config = write_config(tmp_path / "lanes.yaml", [spare.url], first_token_s=1, idle_s=300)
    sc = sidecar(config=config, traces=False, args=("--pool-poll-interval", "60"))
    spare.pause()
    try:
        rid = uuid.uuid4().hex
        r = httpx.post(sc.url + CHAT, json=chat(8), headers={"x-request-id": rid}, timeout=60)
    finally:
        spare.resume()
    assert r.status_code == 504, r.content
    assert r.json()["error"]["type"] == "GatewayTimeoutError"
    assert "first_token_s" in r.json()["error"]["message"], r.json()
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
    """A replica that stops sending mid-stream: error frame after idle_s, event says timeout.

    The engine core runs in step with the reader and is frozen before the replica is
    (tests.support.engine_core), so the stream is mid-way on any machine (before: up to
    three tries); the idle deadline is judged by the message naming it, not the clock."""
    config = write_config(tmp_path / "lanes.yaml", [spare.url], first_token_s=15, idle_s=1.5)
    sc = sidecar(config=config, traces=False, args=("--pool-poll-interval", "60"))
    with engine_core_throttled(spare) as throttle:
        stream = Stream(sc.url + CHAT, chat(LONG), on_data=throttle.read)
        assert stream.first_output.wait(60)
        throttle.freeze()
        spare.pause()
        try:
            stream.wait(60)
        finally:
            spare.resume()
    assert not stream.finished_normally, stream.body[-300:]
    error = assert_clean_stream_error(stream)
    assert "idle" in error["message"]
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
    wait_until(lambda: vllm_running(spare) == 0, 60, "vLLM to abort the timed-out request")
    assert httpx.post(sc.url + CHAT, json=chat(4, stream=False), timeout=60).status_code == 200
    assert_exits_promptly(sc)


def test_replica_late_on_one_poll_keeps_its_health_and_engine_state(
    vllm: VllmServer, spare: VllmServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """A replica that answers a poll late (busy) stays up, with its last KV reading.

    The replica is frozen until the sidecar has logged one late poll of it
    (replica_metrics_slow), not for a guessed 1.5 s: the freeze spans one late poll, maybe
    part of the next, whatever the machine's pace; the tolerance is two. Seen on every
    scrape meanwhile and until the thawed replica answers again (a 60 s hang guard)."""
    config = write_config(tmp_path / "lanes.yaml", [spare.url, vllm.url], first_token_s=5)
    sc = sidecar(config=config, traces=False, args=("--pool-poll-interval", "1"))
    up = {"pool": "main", "replica": spare.url}
    wait_until(lambda: metric(sc.url, "vllm_obs_pool_up", **up) == 1, 60, "spare up")
    seen: list[tuple[float, bool]] = []

    def look() -> None:
        kv = samples(sc.url).get("vllm_obs_pool_kv_cache_usage_ratio", [])
        pool_up = metric(sc.url, "vllm_obs_pool_up", **up)
        seen.append((pool_up, any(lb.get("replica") == spare.url for lb, _ in kv)))

    def late_polls() -> int:
        return sc.log_tail(1 << 20).count("replica_metrics_slow")

    spare.pause()
    try:
        deadline = time.monotonic() + 60
        while not late_polls():
            assert time.monotonic() < deadline, "the frozen replica's poll was never late"
            look()
    finally:
        spare.resume()
    wait_until(lambda: spare_answers(spare), 60, "the thawed replica to answer")
    for _ in range(3):
        look()
    assert seen and all(pool_up == 1 and kv for pool_up, kv in seen), seen
    assert late_polls() <= 2, sc.log_tail()
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


def spare_answers(server: VllmServer) -> bool:
    try:
        return httpx.get(server.url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


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
    if not running(spare):
        spare.start()
    sc = sidecar(config=config, traces=False, args=("--pool-poll-interval", "60"))
    client = openai.OpenAI(base_url=sc.url + "/v1", api_key="x", max_retries=0)
    # Closed after the test: the stream cut by the kill leaves its socket in the client's
    # pool, and one left for pytest's last collection fails the session (ResourceWarning).
    request.addfinalizer(client.close)
    rid = uuid.uuid4().hex
    got: list[str] = []
    raised: openai.APIError | None = None
    # The engine core runs in step with the client and is frozen before the kill
    # (tests.support.engine_core): the kill lands mid-stream on any machine (before: a
    # second try when vLLM had delivered the stream whole).
    with engine_core_throttled(spare) as throttle:
        chunks = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "def main():"}],
            max_tokens=LONG,
            stream=True,
            extra_body={"ignore_eos": True},
            extra_headers={"x-request-id": rid},
        )
        try:
            for chunk in chunks:
                throttle.read()
                if chunk.choices and chunk.choices[0].delta.content:
                    got.append(chunk.choices[0].delta.content)
                    if len(got) == 1:
                        throttle.freeze()
                        spare.kill()
        except openai.APIError as e:  # the clean way for a stream to fail: an error frame
            raised = e
    assert raised is not None, "the stream ended whole: the kill did not cut it"
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
