"""Faults of the sidecar itself: SIGTERM under load (in-flight streams finish within the
grace, or end with a clean error past it; events flushed) and SIGKILL (only requests in
flight are lost; every finished one is on disk as a whole line).

Replicas are real ``vllm serve`` processes: the session engine and the spare one
(``spare``, tests/conftest.py).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from obs import conventions as c
from obs.engines.server import VllmServer
from tests.conftest import SidecarFactory
from tests.support.engine_core import engine_core_throttled
from tests.support.faults_support import (
    CHAT,
    GRACEFUL,
    LONG,
    Stream,
    answered,
    assert_clean_stream_error,
    chat,
    event_of,
    vllm_running,
    wait_until,
    write_config,
)
from tests.support.probes import DONE_FRAME

pytestmark = pytest.mark.engine


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
    deadline = time.monotonic() + 60  # a hang guard: the loop ends at the first refusal
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
    """A stream still running when the grace period ends: error frame, event says so.

    The engine core runs in step with the reader, then is frozen before the SIGTERM
    (tests.support.engine_core): the stream cannot finish within the grace on any machine,
    so one try judges the cut (before: up to three, for a vLLM that delivered the whole
    answer before the grace ended). The lane's timeouts are 120 s: only the grace ends it."""
    config = write_config(tmp_path / "lanes.yaml", [spare.url], first_token_s=120, idle_s=120)
    sc = sidecar(config=config, traces=False, args=("--shutdown-grace", "1"))
    with engine_core_throttled(spare) as throttle:
        stream = Stream(sc.url + CHAT, chat(LONG), on_data=throttle.read)
        assert stream.first_output.wait(60)
        throttle.freeze()  # no token more until the block ends
        os.kill(sc.pid, signal.SIGTERM)
        stream.wait(60)
        assert sc.proc is not None and sc.proc.wait(60) in GRACEFUL
    assert not stream.finished_normally, stream.body[-300:]
    error = assert_clean_stream_error(stream)
    assert "shut" in error["message"]
    ev = event_of(sc, stream.request_id)
    assert ev["status"] == c.ERROR, ev
    assert ev["error_class"] and ev["error_phase"] == "decode", ev
    # The stream's upstream connection was closed: vLLM stops generating for nobody.
    wait_until(lambda: vllm_running(spare) == 0, 60, "vLLM to abort the cut stream")


def test_sigkill_of_the_sidecar_loses_only_requests_in_flight(
    spare: VllmServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """SIGKILL: finished requests are all on disk as whole lines; in-flight ones are lost.

    The five finished requests' events are on disk before the kill (waited for); the two
    streams are in flight when it lands, on any machine: the engine core runs in step with
    their readers and is frozen before the kill (tests.support.engine_core), so neither can
    have finished (before: up to three tries, for a vLLM that delivered them whole)."""
    config = write_config(tmp_path / "lanes.yaml", [spare.url])
    sc = sidecar(config=config, traces=False)
    done = [answered(sc) for _ in range(5)]
    assert len(sc.wait_events(len(done), timeout_s=60)) == len(done)
    with engine_core_throttled(spare) as throttle:
        streams = [Stream(sc.url + CHAT, chat(LONG), on_data=throttle.read) for _ in range(2)]
        for s in streams:
            assert s.first_output.wait(60)
        throttle.freeze()
        sc.kill()
        for s in streams:
            s.wait(60)
    # The client sees its connection drop mid-body (no error frame: nobody is left to send it).
    for s in streams:
        assert s.error is not None or not s.body.endswith(DONE_FRAME), s.body[-300:]
    assert sc.events_path is not None
    raw = sc.events_path.read_bytes()
    assert raw.endswith(b"\n")  # whole lines only
    assert [e["request_id"] for e in sc.events()] == done
    # The kernel closed the sidecar's upstream sockets: vLLM aborts the orphaned streams.
    wait_until(lambda: vllm_running(spare) == 0, 60, "vLLM to abort the orphaned streams")
