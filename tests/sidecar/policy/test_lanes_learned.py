"""The shipped lanes recognise a slow reader from how it read, against a real `vllm serve`.

One client (its own API key) stops reading its first stream (a 4 KiB receive buffer):
that request is chat (nothing is known of it yet); its next two go to slow-stream, learned; it
reads those fast (``fast_streams_to_forget``: 2), and its fourth is chat again. Another client
reading fast stays chat.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from obs import conventions as c
from obs.demo.workload import write_lanes
from obs.engines.server import VllmServer
from tests.conftest import SidecarFactory
from tests.support import chat_body
from tests.support.lanes_support import CHAT, LONG
from tests.support.probes import metric
from tests.support.small_window import RCVBUF, small_window_post

pytestmark = pytest.mark.engine


def _stream(url: str, key: str, rid: str, stall: bool) -> None:
    """A 120-token streamed answer (~30 KB). With ``stall``, the client (a 4 KiB receive
    buffer) reads nothing until the pool has finished (the lane's slot is free again) and 1.5 s
    more, as a phone that stops reading: the sidecar holds the rest, and its stream phase shows
    the wait whatever the engine's speed."""
    body = chat_body(f"tell me {rid}", 120, stream=True, **LONG)
    headers = {"authorization": f"Bearer {key}", "x-request-id": rid}
    with small_window_post(url, CHAT, body, headers, rcvbuf=RCVBUF if stall else None) as r:
        assert r.status == 200
        if stall:
            deadline = time.monotonic() + 60
            while metric(url, "vllm_obs_in_flight_requests") > 0:
                assert time.monotonic() < deadline, "the pool never finished the stream"
                time.sleep(0.1)
            time.sleep(1.5)
        r.read()


def test_a_slow_reader_is_learned_routed_to_the_slow_lane_and_let_go(
    vllm: VllmServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """Slowly read stream -> next requests slow-stream (learned) -> two read fast -> chat."""
    config = tmp_path / "lanes.yaml"
    write_lanes(config, {"interactive": [vllm.url], "bulk": [vllm.url]})
    sc = sidecar(config=config, traces=False)
    slow, fast = f"sk-slow-{uuid.uuid4().hex}", f"sk-fast-{uuid.uuid4().hex}"
    plan = [(slow, True), (fast, False), (slow, False), (slow, False), (fast, False), (slow, False)]
    rids = []
    for key, stall in plan:
        rids.append(uuid.uuid4().hex)
        _stream(sc.url, key, rids[-1], stall)
    events = {e["request_id"]: e for e in sc.wait_events(len(plan))}
    got = [(events[r]["lane"], events[r]["class_source"]) for r in rids]
    assert events[rids[0]]["stream_ms"] >= 1000  # the slow read shows in the stream phase
    assert got == [
        ("chat", "default"),
        ("chat", "default"),
        ("slow-stream", "learned"),
        ("slow-stream", "learned"),
        ("chat", "default"),
        ("chat", "default"),
    ]
    assert all(events[r]["status"] == c.OK for r in rids)
    assert metric(sc.url, "vllm_obs_classified_total", lane="slow-stream", source="learned") == 2
    assert metric(sc.url, "vllm_obs_slow_readers") == 0  # let go after its fast read
