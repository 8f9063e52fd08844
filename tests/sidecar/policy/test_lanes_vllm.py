"""Lanes against two real `vllm serve` pools: routing, slow readers, prefix affinity, tenants
(routing and slow readers also with a real llama.cpp pool as the second: a mixed config).

The second engine (``vllm_b``, tests/conftest.py) has a small KV cache and vLLM's own
admission limit. Requests that must hold a lane slot generate 1900 tokens with
``ignore_eos`` (seconds on the tiny model); a slot is seen taken on the sidecar's
in-flight gauge, not guessed from timing.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from obs import conventions as c
from obs.cli import main as cli_main
from obs.demo.workload import write_lanes
from obs.engines.server import VllmServer
from obs.loadgen.records import read_records
from obs.sidecar.testing import SidecarProcess
from tests.conftest import SidecarFactory
from tests.loadgen.test_loadgen_engine import TINY_MIX
from tests.support import chat_body, event_of, probes
from tests.support.lanes_support import (
    CHAT,
    LONG,
    lane_spec,
    lanes_config,
    post_lane,
)
from tests.support.small_window import RCVBUF, small_window_post

pytestmark = pytest.mark.engine

# ---- routing ----------------------------------------------------------------------------


# The tiny GGUF model's tokenizer makes about 5 tokens of the 4 characters the load generator
# counts as one: the bulk classes' prompts, shortened to fit llama-server's 2048-token slots.
_LLAMA_BULK = ["long-prefill.prompt_tokens=[120,160]", "batch.prompt_tokens=[60,100]"]


@pytest.mark.parametrize("bulk_engine", ["vllm_b", "llama"])
def test_default_config_routes_the_six_classes_to_their_lanes_and_pools(
    bulk_engine: str,
    vllm: VllmServer,
    sidecar: SidecarFactory,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """The shipped lanes route each load-generator class to its lane and pool; metrics agree,
    with the bulk pool on a second vLLM or on llama.cpp (a mixed config, engine detected)."""
    bulk: VllmServer = request.getfixturevalue(bulk_engine)
    config = write_lanes(tmp_path / "lanes.yaml", {"interactive": [vllm.url], "bulk": [bulk.url]})
    sc = sidecar(config=tmp_path / "lanes.yaml", traces=False)
    args = ["load", "--url", sc.url, "--requests", "24", "--rate", "8", "--seed", "5"]
    args += ["--out", str(tmp_path / "records.jsonl"), "--no-progress"]
    mix = TINY_MIX + (_LLAMA_BULK if bulk_engine == "llama" else [])
    args += [a for s in mix for a in ("--set", s)]
    assert cli_main(args) == 0
    sent = {r.request_id: r.client_class for r in read_records(tmp_path / "records.jsonl")}
    expected = {lane.name: lane.pool for lane in config.lanes}
    events = sc.wait_events(len(sent))
    seen: Counter[str] = Counter()
    for ev in events:
        cls = sent[ev["request_id"]]
        assert ev["lane"] == cls, (cls, ev["lane"])
        assert ev["pool"] == expected[cls]
        assert ev["replica"] == (vllm.url if expected[cls] == "interactive" else bulk.url)
        # a burst on vllm_b (3 unfinished requests at most) may be refused: rejected; else answered
        assert ev["status"] == c.REJECTED or ev["completion_tokens"] > 0, ev
        seen[cls] += 1
    assert set(seen) == set(expected), seen
    series = probes.samples(sc.url)[c.REQUESTS.name + "_total"]
    by_lane: Counter[str] = Counter()
    for lb, v in series:
        assert expected[lb[c.LANE]] == lb[c.POOL]
        by_lane[lb[c.LANE]] += int(v)
    assert by_lane == seen


# ---- slow readers -------------------------------------------------------------------------


def _read_stream(sc: SidecarProcess, lane: str, rid: str, bytes_per_s: float | None) -> bytes:
    """Stream a 300-token answer, reading at ``bytes_per_s`` (None: as fast as it comes).

    The slow client's socket has a 4 KiB receive buffer, as a phone on a slow link has
    a small window: what it has not read stays on the sidecar's side.
    """
    body = chat_body(f"slow {rid}", 300, stream=True, **LONG)
    headers = {"x-lane": lane, "x-request-id": rid}
    out = b""
    with small_window_post(
        sc.url, CHAT, body, headers, rcvbuf=RCVBUF if bytes_per_s else None
    ) as r:
        while chunk := r.read(1024):
            out += chunk
            if bytes_per_s:
                time.sleep(len(chunk) / bytes_per_s)
    return out


def _fast_lane_run(sc: SidecarProcess, n: int) -> list[str]:
    rids = []
    for i in range(n):
        rid = uuid.uuid4().hex
        _read_stream_short(sc, rid, i)
        rids.append(rid)
    return rids


def _read_stream_short(sc: SidecarProcess, rid: str, i: int) -> None:
    body = chat_body(f"quick question {i} {rid}", 32, stream=True)
    headers = {"x-lane": "fast", "x-request-id": rid}
    with httpx.stream("POST", sc.url + CHAT, json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200
        r.read()


def _median(xs: list[float]) -> float:
    assert xs, "no request measured it"
    return sorted(xs)[len(xs) // 2]


@pytest.mark.parametrize("slow_engine", ["vllm", "llama"])
def test_slow_readers_leave_other_lanes_alone_and_show_their_lag(
    slow_engine: str,
    vllm: VllmServer,
    sidecar: SidecarFactory,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """Slow readers: the pool ends at its pace, the stream phase holds the lag, others unhurt;
    also with the slow lane on a llama.cpp pool beside the fast lane's vLLM (a mixed config)."""
    slow: dict[str, Any] = {"buffer_bytes": 1 << 20, "policy": "wait"}
    slow_pool = request.getfixturevalue(slow_engine)
    pools = {"p": [vllm.url], "s": [slow_pool.url]}
    lanes = [lane_spec("slow", pool="s", slow_client=slow), lane_spec("fast")]
    sc = sidecar(config=lanes_config(tmp_path, pools, lanes), traces=False)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    # Slow readers read well below the pool's pace. On a loaded 2-core machine (CI), the tiny
    # GGUF model's 2 slots made their 300 frames (~230 B each) no faster than 8000 B/s reads.
    slow_rate = {"vllm": 8000.0, "llama": 3000.0}[slow_engine]
    for label, rate in (("fast readers", None), ("slow readers", slow_rate)):
        slow_ids = [uuid.uuid4().hex for _ in range(4)]
        with ThreadPoolExecutor(4) as ex:
            streams = [ex.submit(_read_stream, sc, "slow", rid, rate) for rid in slow_ids]
            fast_ids = _fast_lane_run(sc, 8)
            bodies = [f.result() for f in streams]
        assert all(b.rstrip().endswith(b"data: [DONE]") for b in bodies)
        runs[label] = {
            "slow": [event_of(sc, rid) for rid in slow_ids],
            "fast": [event_of(sc, rid) for rid in fast_ids],
        }
    for ev in runs["slow readers"]["slow"]:
        assert ev["status"] == c.OK and ev["completion_tokens"] == 300
    # The pool was done long before the client: the lag is the stream phase. (Socket buffers on
    # the way can hold a whole answer of 300 short frames, and the sidecar then has nothing
    # left to wait for: 3 of 4 readers lagging is the bar.)
    lagged = [
        ev["stream_ms"]
        for ev in runs["slow readers"]["slow"]
        if ev["stream_ms"] > 1000 and ev["stream_ms"] > ev["e2e_ms"] / 2
    ]
    assert len(lagged) >= 3, runs["slow readers"]["slow"]
    # Fast readers lag little: a fraction of the slow readers' lag (an absolute bound flakes on
    # this shared 2-core machine, where a reader thread can wait half a second for a core).
    # Compared by the median: one reader thread starved by the machine is not the sidecar.
    least_slow_lag = min(lagged)
    fast_lag = _median([ev["stream_ms"] for ev in runs["fast readers"]["slow"]])
    assert fast_lag < min(1500.0, least_slow_lag / 3), (fast_lag, least_slow_lag)
    # The other lane: TTFT and inter-token latency within noise of the run without them. A
    # stream whose output all came in one read has no ITL (null, docs/record.md): left out.
    # Compared when both lanes share the engine: with the slow lane on llama.cpp, the fast
    # lane's vLLM competes with llama.cpp's threads for the 2 cores, and its latency moves
    # with when they overlap (20x under load in a test run), not with the relay.
    fields = (("ttft_ms", 250.0), ("itl_p50_ms", 25.0)) if slow_engine == "vllm" else ()
    for field, slack_ms in fields:
        base_xs = [ev[field] for ev in runs["fast readers"]["fast"] if ev[field] is not None]
        slow_xs = [ev[field] for ev in runs["slow readers"]["fast"] if ev[field] is not None]
        if field == "itl_p50_ms" and not (base_xs and slow_xs):
            continue  # every short answer of a run came in one read (vLLM wrote it whole)
        base, with_slow = _median(base_xs), _median(slow_xs)
        assert with_slow <= 2 * base + slack_ms, (field, base, with_slow)


def test_abort_policy_ends_a_stream_whose_client_falls_behind(
    vllm: VllmServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """abort policy: past the bound the stream ends with a slow_client error, recorded."""
    lanes = [lane_spec("a", slow_client={"buffer_bytes": 16384, "policy": "abort"})]
    sc = sidecar(config=lanes_config(tmp_path, {"p": [vllm.url]}, lanes), traces=False)
    rid = uuid.uuid4().hex
    body = chat_body(f"never read {rid}", 1900, stream=True, **LONG)
    headers = {"x-lane": "a", "x-request-id": rid}
    with small_window_post(sc.url, CHAT, body, headers, timeout_s=60) as r:
        ev = event_of(sc, rid)  # written while the client has read nothing yet
        rest = r.read()
    assert (ev["status"], ev["error_class"], ev["http_status"]) == (
        c.CLIENT_ERROR,
        "slow_client",
        200,
    )
    assert "16384 bytes behind" in ev["error_message"]
    assert b'"type":"SlowClientError"' in rest and rest.rstrip().endswith(b"data: [DONE]")
    assert rest.count(b"data: ") < 1900  # cut short, not the whole answer


# ---- prefix affinity --------------------------------------------------------------------


def _document(seed: str) -> str:
    words = [uuid.uuid5(uuid.NAMESPACE_OID, f"{seed}-{i}").hex[:6] for i in range(200)]
    return " ".join(words)


def test_prefix_affinity_raises_the_cache_hit_ratio_across_two_replicas(
    vllm: VllmServer, vllm_b: VllmServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """Two replicas: prefix_affinity hits the prefix cache more than least_outstanding."""
    lanes = [
        {**lane_spec("affinity"), "routing": "prefix_affinity"},
        {**lane_spec("least"), "routing": "least_outstanding"},
    ]
    cfg = lanes_config(tmp_path, {"p": [vllm.url, vllm_b.url]}, lanes)
    sc = sidecar(config=cfg, traces=False)
    ratios, spread = {}, {}
    for lane in ("affinity", "least"):
        run = uuid.uuid4().hex
        docs = [_document(f"{run}-{d}") for d in range(6)]
        bodies = [
            {
                "model": "tiny",
                "max_tokens": 24,  # long enough to overlap: least_outstanding spreads them
                "messages": [
                    {"role": "system", "content": docs[q % 6]},
                    {"role": "user", "content": f"question {q} about it?"},
                ],
            }
            for q in range(24)
        ]
        rids = [f"{lane}-{run}-{q}" for q in range(24)]
        with ThreadPoolExecutor(3) as ex:
            futures = [
                ex.submit(post_lane, sc, lane, body, **{"x-request-id": rid})
                for body, rid in zip(bodies, rids, strict=True)
            ]
            results = [f.result() for f in futures]
        assert [r.status_code for r in results] == [200] * 24, results[0].text[:300]
        events = [event_of(sc, rid) for rid in rids]
        assert {ev["replica"] for ev in events} <= {vllm.url, vllm_b.url}
        spread[lane] = max(
            len({ev["replica"] for ev in events[d::6]}) for d in range(6)
        )  # replicas the busiest-spread document went to
        prompt = sum(ev["prompt_tokens"] for ev in events)
        ratios[lane] = sum(ev["cached_tokens"] or 0 for ev in events) / prompt
    # Each document stays on one replica under affinity; under least_outstanding some land on
    # both, and each such landing is one more cold prefill: a lower cached-token ratio.
    assert spread == {"affinity": 1, "least": 2}, spread
    assert ratios["affinity"] > ratios["least"], ratios


# ---- tenants from API keys ----------------------------------------------------------------


def test_hashed_api_keys_map_to_tenants_and_gate_the_sidecar(
    vllm: VllmServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """With keys configured: no or unknown key is 401; a listed key names the event's tenant."""
    key = f"sk-{uuid.uuid4().hex}"
    hashed = subprocess.run(
        [sys.executable, "-m", "obs.cli", "config", "hash-key", "team-a"],
        input=key,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    cfg = lanes_config(tmp_path, {"p": [vllm.url]}, [lane_spec("a")])
    cfg.write_text(cfg.read_text() + hashed)
    sc = sidecar(config=cfg, traces=False)
    for auth in ({}, {"authorization": "Bearer sk-wrong"}, {"authorization": "Basic x"}):
        r = post_lane(sc, "a", chat_body("who am I?"), **auth)
        assert r.status_code == 401, r.text
        assert r.json()["error"]["type"] == "AuthenticationError"
    r = post_lane(sc, "a", chat_body("who am I?"), authorization=f"Bearer {key}")
    assert r.status_code == 200, r.text
    events = sc.wait_events(4)
    assert [(ev["status"], ev["error_class"], ev["tenant"]) for ev in events] == [
        (c.CLIENT_ERROR, "unauthorized", None)
    ] * 3 + [(c.OK, None, "team-a")]
    logs = sc.log_tail(100_000) + (tmp_path / "events-0.jsonl").read_text()
    assert key not in logs
