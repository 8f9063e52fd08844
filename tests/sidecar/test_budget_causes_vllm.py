"""Where the error budget went, on a real vLLM: a long prefill and a slow client made to
happen, then found named by each event's ``miss_cause``, by ``vllm-obs query budget`` and by
the misses counter's exemplars.

The session's spare engine (tests/conftest.py) shows each cause large: its
``--max-num-batched-tokens 128`` makes a 3000-token prompt prefill in ~25 engine steps, a short
one in one (~130 ms against ~10 ms); and a client that reads a ~200-360 KB stream through a 4
KiB window after a pause (the relay waits on it for seconds). Each cause has its own lane, so
each lane's baseline is its own good requests. (The engine queue is not here: on this CPU engine
vLLM's API server, not its scheduler, holds a request while two others generate, so its span's
queue time is a fraction of the wait; see tests/core/test_attribution.py for the rule.)
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from obs import conventions as c
from obs.engines.server import VllmServer
from obs.sidecar.testing import OtlpReceiver, SidecarProcess
from tests.conftest import engine_running
from tests.support import chat_body
from tests.support.lanes_support import query_budget
from tests.support.small_window import small_window_post

pytestmark = pytest.mark.engine

CHAT = "/v1/chat/completions"
PREFILL_TTFT_MS = 60  # the long-prefill lane: short prompts answer in ~10-30 ms
SLOW_TPOT_MS = 20  # the slow-client lane: the engine makes a token every ~1.5-5 ms


def _lane(name: str, slo: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "pool": "p",
        "match": [{"header": {"x-lane": name}}],
        "slo": slo,
        # The relay stops reading the pool while 4 KiB wait for the client: a slow reader
        # slows the stream down to its pace (and a holder keeps its engine slot).
        "admission": {"slow_client": {"buffer_bytes": 4096, "policy": "wait"}},
        "timeouts": {"connect_s": 30, "first_token_s": 120, "idle_s": 120},
    }


class Stack:
    def __init__(self, vllm: VllmServer, sidecar: SidecarProcess, config: Path) -> None:
        self.vllm, self.sidecar, self.config = vllm, sidecar, config


@pytest.fixture(scope="module")
def stack(
    spare_engine: VllmServer,
    otlp_receiver: OtlpReceiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    """The spare engine (started if it is not running), and a sidecar with one lane per cause."""
    work = tmp_path_factory.mktemp("causes")
    vllm = spare_engine
    if not engine_running(vllm):
        vllm.start()
    lanes = [
        _lane("lp", {"ttft": {"threshold_ms": PREFILL_TTFT_MS, "objective": 0.9}}),
        _lane("sc", {"tpot": {"threshold_ms": SLOW_TPOT_MS, "objective": 0.9}}),
    ]
    pools = [{"name": "p", "replicas": [vllm.url]}]
    config = work / "lanes.yaml"
    data = {"version": 1, "pools": pools, "lanes": lanes, "default_lane": "lp"}
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    sidecar = SidecarProcess(
        config=config,
        events=work / "events.jsonl",
        env={
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": otlp_receiver.url,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        },
        log_path=work / "sidecar.log",
    )
    try:
        sidecar.start()
        yield Stack(vllm, sidecar, config)
    finally:
        sidecar.stop()  # the spare engine is the session's: conftest stops it


def _chat(sc: SidecarProcess, lane: str, rid: str, text: str, max_tokens: int) -> None:
    body = chat_body(text, max_tokens, stream=True)
    headers = {"x-lane": lane, "x-request-id": rid}
    with httpx.stream("POST", sc.url + CHAT, json=body, headers=headers, timeout=120) as r:
        r.read()
    assert r.status_code == 200, rid


def _warm(sc: SidecarProcess, lane: str) -> list[str]:
    """Three short good requests: the lane's baseline."""
    rids = [f"{lane}-warm-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
    for i, rid in enumerate(rids):
        _chat(sc, lane, rid, f"short question {i} on {lane}", 16)
    return rids


def _long_prefill(sc: SidecarProcess) -> list[str]:
    """Two prompts of ~3000 tokens (distinct from their first token: no cached prefix)."""
    rids = [f"long-{i}-{uuid.uuid4().hex[:6]}" for i in range(2)]
    for rid in rids:
        text = f"{rid}: " + " ".join(f"v{k} = f({k})" for k in range(330))
        _chat(sc, "lp", rid, text, 4)
    return rids


def _slow_reader(sc: SidecarProcess) -> str:
    """A stream of 200 tokens with their top-20 logprobs (200-360 KB: sampled tokens vary the
    size, and 100 of them once fit the ~80 KB of socket buffers on the way) read through a
    4 KiB window after a 6 s pause (30 ms per token at least): far behind the engine, so the
    relay waits on it and the pool's stream with it."""
    rid = f"slow-{uuid.uuid4().hex[:6]}"
    body = chat_body(f"slow {rid}", 200, stream=True, ignore_eos=True, logprobs=True)
    body["top_logprobs"] = 20
    headers = {"x-lane": "sc", "x-request-id": rid}
    with small_window_post(sc.url, CHAT, body, headers) as r:
        r.read(1024)
        time.sleep(6)
        tail = r.read()
    assert tail.rstrip().endswith(b"data: [DONE]")
    return rid


def _miss_exemplars(sc: SidecarProcess) -> dict[tuple[str, str], str]:
    """(lane, cause) -> the trace id the misses counter's series carries as its exemplar."""
    page = httpx.get(
        sc.url + "/metrics", headers={"Accept": "application/openmetrics-text"}, timeout=10
    ).text
    return {
        (s.labels[c.LANE], s.labels[c.CAUSE]): s.exemplar.labels[c.EXEMPLAR_TRACE_ID]
        for fam in text_string_to_metric_families(page)
        if fam.name == c.SLO_MISSES.name
        for s in fam.samples
        if s.exemplar is not None
    }


def test_long_prefill_and_slow_client_are_named(stack: Stack) -> None:
    """Each cause made large on a real engine is its misses' miss_cause, the top cause of its
    lane in `query budget`, and the misses counter's exemplar is a missed request's trace."""
    sc = stack.sidecar
    warm = [rid for lane in ("lp", "sc") for rid in _warm(sc, lane)]
    longs = _long_prefill(sc)
    slow = _slow_reader(sc)
    mine = [*warm, *longs, slow]
    deadline = time.monotonic() + 30
    while {e["request_id"] for e in sc.events()} < set(mine) and time.monotonic() < deadline:
        time.sleep(0.2)
    events = {e["request_id"]: e for e in sc.events()}

    for rid in longs:
        e = events[rid]
        assert e["prompt_tokens"] > 3000 and e["ttft_ms"] > PREFILL_TTFT_MS, e
        assert (e["miss_slo"], e["miss_phase"], e["miss_cause"]) == (
            "ttft", "prefill", "long_prefill"
        ), e  # fmt: skip
    e = events[slow]
    assert e["status"] == c.OK and e["tpot_ms"] > SLOW_TPOT_MS, e
    assert e["stream_blocked_ms"] > 1000, e
    assert (e["miss_slo"], e["miss_phase"], e["miss_cause"]) == ("tpot", "decode", "slow_client")

    spent = query_budget(sc.events_path or Path())
    for (lane, slo), (phase, cause, n) in {
        ("lp", "ttft"): ("prefill", "long_prefill", len(longs)),
        ("sc", "tpot"): ("decode", "slow_client", 1),
    }.items():
        rows = {(r["phase"], r["cause"]): r["misses"] for r in spent[(lane, slo)]["by_phase_cause"]}
        assert rows.get((phase, cause), 0) >= n, (lane, rows)
        top = spent[(lane, slo)]["by_phase_cause"][0]
        assert (top["phase"], top["cause"]) == (phase, cause), (lane, rows)

    exemplars = _miss_exemplars(sc)
    assert exemplars[("lp", "long_prefill")] in {events[r]["trace_id"] for r in longs}
    assert exemplars[("sc", "slow_client")] == events[slow]["trace_id"]
