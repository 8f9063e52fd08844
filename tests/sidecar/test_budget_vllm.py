"""Where the error budget went, on real pools: misses made to happen, then named.

One lane on the session's vLLM admits one request at a time, so requests sent while a slot is
held wait in its admission queue past the TTFT threshold; another lane's pool is a closed port
that refuses every connection. The sidecar stamps each miss on its event and counts it on
/metrics, and `vllm-obs query budget` over the event log charges the first lane's misses to
the queue phase and its admission queue, the second's to the upstream error.
"""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from obs import conventions as c
from obs.engines.server import VllmServer
from tests.conftest import SidecarFactory
from tests.support import chat_body, probes
from tests.support.lanes_support import (
    holding,
    lane_spec,
    lanes_config,
    post_lane,
    query_budget,
    wait_queued,
)

pytestmark = pytest.mark.engine

TTFT_MS = 3000  # the queued lane's TTFT threshold
HOLD_S = 5.0  # how long the slot is held: every queued request waits longer than TTFT_MS
QUEUED = 4  # more than the warm-up requests: the queue is the top cause whatever they do


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _stream(sc: Any, lane: str, text: str) -> int:
    body = chat_body(text, 4, stream=True)
    with httpx.stream(
        "POST", sc.url + "/v1/chat/completions", json=body, headers={"x-lane": lane}, timeout=120
    ) as r:
        r.read()
        return r.status_code


def test_budget_names_the_admission_queue_and_the_refused_pool(
    vllm: VllmServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """Queued lane: queue/admission_queue; refused pool: queue/upstream_error (events,
    /metrics and `query budget` agree)."""
    slo = {"ttft": {"threshold_ms": TTFT_MS, "objective": 0.9}, "availability": {}}
    queued = lane_spec("q", max_concurrency=1, max_queue=10, queue_timeout_s=120) | {"slo": slo}
    down = lane_spec("down", pool="dead") | {"slo": {"availability": {"objective": 0.99}}}
    cfg = lanes_config(tmp_path, {"p": [vllm.url], "dead": [_closed_port()]}, [queued, down])
    sc = sidecar(config=cfg, traces=False)
    for i in range(3):  # good requests: the lane's baseline
        assert _stream(sc, "q", f"warm {i}") == 200
    # The holder lets go on leaving the block, before the pool waits for the queued requests
    # (they need its slot: in the other order the block ended only at the sidecar's timeout).
    with ThreadPoolExecutor(QUEUED) as ex, holding(sc, "q", 1):
        waiting = [ex.submit(_stream, sc, "q", f"queued {i}") for i in range(QUEUED)]
        wait_queued(sc, "q", QUEUED)
        time.sleep(HOLD_S)
    assert [f.result() for f in waiting] == [200] * QUEUED
    for i in range(2):
        assert post_lane(sc, "down", chat_body(f"refused {i}")).status_code == 503
    events = sc.wait_events(3 + 1 + QUEUED + 2)
    stamped = [(e["lane"], e["miss_slo"], e["miss_phase"], e["miss_cause"]) for e in events]
    assert stamped.count(("q", "ttft", "queue", "admission_queue")) == QUEUED, stamped
    assert stamped.count(("down", "availability", "queue", "upstream_error")) == 2, stamped
    # A warm-up request slow on a starved machine may miss too, but never in the queue.
    assert sum(s[0] == "q" and s[2] == "queue" for s in stamped) == QUEUED, stamped

    misses = probes.metric(
        sc.url, c.SLO_MISSES.name + "_total",
        **{c.LANE: "q", c.SLO_LABEL: "ttft", c.PHASE: "queue", c.CAUSE: "admission_queue"},
    )  # fmt: skip
    assert misses == QUEUED

    assert sc.events_path is not None
    spent = query_budget(sc.events_path)
    q, d = spent[("q", "ttft")], spent[("down", "availability")]
    assert q["misses"] >= QUEUED and q["budget_spent"] > 1
    top = q["by_phase_cause"][0]
    assert (top["phase"], top["cause"], top["misses"]) == ("queue", "admission_queue", QUEUED)
    assert [(r["phase"], r["cause"], r["misses"]) for r in d["by_phase_cause"]] == [
        ("queue", "upstream_error", 2)
    ]
    assert d["top_replicas"][0]["misses"] == 2
    assert all(w["show"].startswith("vllm-obs query show ") for w in q["worst"] + d["worst"])
