"""Lane admission against real engines: concurrency and queue bounds, queue timeouts, the
prompt cap and token budget, tenant fair share, vLLM's own 503 load shedding, an
unavailable pool.

The admission tests run twice: on a vLLM pool, and on a real llama.cpp pool in a mixed
config beside a vLLM pool (``lane_pools``). A slot is seen taken on the sidecar's in-flight
gauge, not guessed from timing.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from obs import conventions as c
from obs.engines.llamacpp_server import LlamaServer
from obs.engines.server import VllmServer
from tests.conftest import VLLM_B_QUEUE_CAP, SidecarFactory
from tests.support import chat_body, event_of
from tests.support.engine_core import engine_core_pid
from tests.support.lanes_support import (
    CHAT,
    LONG,
    assert_rejected,
    holding,
    lane_gauge,
    lane_spec,
    lanes_config,
    post_lane,
    rejections,
    wait_queued,
)
from tests.support.probes import wait_for

pytestmark = pytest.mark.engine


@pytest.fixture(params=["vllm", "mixed"])
def lane_pools(request: pytest.FixtureRequest, vllm: VllmServer) -> dict[str, list[str]]:
    """Lane pool ``p``: vLLM alone, or llama.cpp beside a vLLM pool (the mixed config).

    Admission is the sidecar's, whatever the engine: the same tests pass on both.
    """
    if request.param == "vllm":
        return {"p": [vllm.url]}
    llama: LlamaServer = request.getfixturevalue("llama")
    return {"p": [llama.url], "gpu": [vllm.url]}


# ---- admission --------------------------------------------------------------------------


def test_concurrency_and_queue_limits_reject_past_their_bounds_only(
    lane_pools: dict[str, list[str]], sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """Under max_concurrency requests pass; past it the queue fills, then 429 queue_full."""
    lane = lane_spec("a", max_concurrency=2, max_queue=1, queue_timeout_s=60)
    sc = sidecar(config=lanes_config(tmp_path, lane_pools, [lane]), traces=False)
    with holding(sc, "a", 1):
        assert post_lane(sc, "a", chat_body("under the bound")).status_code == 200
    with holding(sc, "a", 2) as holders, ThreadPoolExecutor(1) as ex:
        queued = ex.submit(post_lane, sc, "a", chat_body("waits in the queue"))
        wait_queued(sc, "a", 1)
        rid = uuid.uuid4().hex
        r = post_lane(sc, "a", chat_body("one too many"), **{"x-request-id": rid})
        assert_rejected(r, 429, c.QUEUE_FULL)
        ev = event_of(sc, rid)
        assert (ev["status"], ev["rejection_reason"], ev["http_status"]) == (
            c.REJECTED,
            c.QUEUE_FULL,
            429,
        )
        holders[0].release()
        assert queued.result().status_code == 200  # admitted when a holder let go
    assert rejections(sc) == {("a", c.QUEUE_FULL): 1}


def test_queue_timeout_rejects_after_the_wait_and_the_event_shows_it(
    lane_pools: dict[str, list[str]], sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """A queued request with no slot within queue_timeout_s gets 429 queue_timeout; queue ~ wait."""
    cfg = lanes_config(
        tmp_path,
        lane_pools,
        [lane_spec("a", max_concurrency=1, max_queue=4, queue_timeout_s=0.5)],
    )
    sc = sidecar(config=cfg, traces=False)
    with holding(sc, "a", 1):
        rid = uuid.uuid4().hex
        r = post_lane(sc, "a", chat_body("times out"), **{"x-request-id": rid})
        assert_rejected(r, 429, c.QUEUE_TIMEOUT)
    ev = event_of(sc, rid)
    assert (ev["status"], ev["rejection_reason"]) == (c.REJECTED, c.QUEUE_TIMEOUT)
    assert ev["queue_ms"] >= 450  # the loop's timer may fire a hair early
    assert ev["error_phase"] == "queue"
    assert rejections(sc) == {("a", c.QUEUE_TIMEOUT): 1}


def test_prompt_cap_and_token_budget_refuse_with_413(
    lane_pools: dict[str, list[str]], sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """A prompt over max_prompt_tokens, or a request over the whole budget: 413 at once."""
    cfg = lanes_config(
        tmp_path,
        lane_pools,
        [lane_spec("a", max_prompt_tokens=100, token_budget=600)],
    )
    sc = sidecar(config=cfg, traces=False)
    assert post_lane(sc, "a", chat_body("x " * 100, max_tokens=8)).status_code == 200  # ~50 tokens
    r = post_lane(sc, "a", chat_body("y " * 400, max_tokens=8))  # ~200 tokens
    assert_rejected(r, 413, c.PROMPT_TOO_LONG)
    assert "at most 100" in r.json()["error"]["message"]
    r = post_lane(sc, "a", chat_body("z " * 100, max_tokens=1000))
    assert_rejected(r, 413, c.OVER_TOKEN_BUDGET)
    assert rejections(sc) == {("a", c.PROMPT_TOO_LONG): 1, ("a", c.OVER_TOKEN_BUDGET): 1}
    statuses = Counter((ev["status"], ev["rejection_reason"]) for ev in sc.wait_events(3))
    assert statuses == {
        (c.OK, None): 1,
        (c.REJECTED, c.PROMPT_TOO_LONG): 1,
        (c.REJECTED, c.OVER_TOKEN_BUDGET): 1,
    }


def test_token_budget_queues_until_tokens_in_flight_free(
    lane_pools: dict[str, list[str]], sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """With the in-flight budget spent, the next request waits in the queue, then runs."""
    cfg = lanes_config(
        tmp_path,
        lane_pools,
        [lane_spec("a", token_budget=2400, max_queue=4, queue_timeout_s=60)],
    )
    sc = sidecar(config=cfg, traces=False)
    rid = uuid.uuid4().hex
    body = chat_body("needs 600 tokens", max_tokens=600)
    with holding(sc, "a", 1) as holders, ThreadPoolExecutor(1) as ex:  # ~1905 of 2400
        waiting = ex.submit(post_lane, sc, "a", body, **{"x-request-id": rid})
        wait_queued(sc, "a", 1)
        time.sleep(0.3)
        holders[0].release()
        assert waiting.result().status_code == 200
    waited = event_of(sc, rid)
    assert waited["status"] == c.OK and waited["queue_ms"] > 300
    assert rejections(sc) == {}


def test_tenant_fair_share_refuses_the_tenant_holding_its_share(
    vllm: VllmServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """In a full lane, a tenant at its share gets 429 tenant_share; another tenant queues."""
    lane = lane_spec(
        "a", max_concurrency=2, max_queue=4, queue_timeout_s=60, tenant_fair_share=True
    )
    cfg = lanes_config(tmp_path, {"p": [vllm.url]}, [lane])
    data = yaml.safe_load(cfg.read_text())
    data["auth"] = {"tenant_header": "x-tenant"}
    cfg.write_text(yaml.safe_dump(data))
    sc = sidecar(config=cfg, traces=False)
    with holding(sc, "a", 2, **{"x-tenant": "big"}) as holders, ThreadPoolExecutor(1) as ex:
        rid = uuid.uuid4().hex
        r = post_lane(
            sc, "a", chat_body("more for big"), **{"x-tenant": "big", "x-request-id": rid}
        )
        assert_rejected(r, 429, c.TENANT_SHARE)
        other = ex.submit(post_lane, sc, "a", chat_body("small's turn"), **{"x-tenant": "small"})
        wait_queued(sc, "a", 1)
        holders[0].release()
        assert other.result().status_code == 200
    ev = event_of(sc, rid)
    assert (ev["status"], ev["rejection_reason"], ev["tenant"]) == (
        c.REJECTED,
        c.TENANT_SHARE,
        "big",
    )
    assert rejections(sc) == {("a", c.TENANT_SHARE): 1}


def test_vllm_503_load_shedding_is_counted_as_engine_queue_full(
    vllm_b: VllmServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """vLLM's own --max-num-queued-reqs 503s reach the client and count as engine_queue_full.
    The burst reaches vLLM while its engine core is frozen (tests.support.engine_core): more
    requests wait than its cap allows however fast the engine would have served them, so
    some are shed in one burst on any machine."""
    cfg = lanes_config(tmp_path, {"p": [vllm_b.url]}, [lane_spec("a")])
    sc = sidecar(config=cfg, traces=False)
    # The clients are built and connected first, then all send together (a client built
    # during the burst costs ~21 ms of CA-bundle loading under the GIL).
    burst = 4 * VLLM_B_QUEUE_CAP
    bodies = [chat_body(f"burst {i}", 800, **LONG) for i in range(burst)]
    answered: list[httpx.Response] = []
    core = engine_core_pid(vllm_b)
    os.kill(core, signal.SIGSTOP)
    sender = ThreadPoolExecutor(1)
    try:
        sent = sender.submit(_together, sc.url, bodies, answered)
        wait_for(  # every request of the burst dispatched to vLLM (or already answered)
            "the burst to reach vLLM",
            lambda: lane_gauge(sc, c.IN_FLIGHT.name, "a") + len(answered) >= burst,
            60,
            0.05,
        )
    finally:
        os.kill(core, signal.SIGCONT)
        sender.shutdown(wait=True)
    results = sent.result()
    codes = Counter(r.status_code for r in results)
    shed = [r for r in results if r.status_code == 503]
    assert codes[200] and codes[503], codes
    for r in shed:
        assert "busy" in r.json()["error"]["message"]  # vLLM's own words, relayed
    events = sc.wait_events(codes.total())
    rejected = [ev for ev in events if ev["http_status"] == 503]
    assert {(ev["status"], ev["rejection_reason"]) for ev in rejected} == {
        (c.REJECTED, c.ENGINE_QUEUE_FULL)
    }
    assert len(rejected) == codes[503]
    assert rejections(sc)[("a", c.ENGINE_QUEUE_FULL)] == codes[503]


def _together(
    base: str, bodies: list[dict[str, object]], answered: list[httpx.Response]
) -> list[httpx.Response]:
    """POST each body to lane ``a`` from its own client, all at once: every client is built
    and has its keep-alive connection open (a scrape) before any request is sent; each answer
    is added to ``answered`` as it comes."""
    clients = [httpx.Client(base_url=base, timeout=120) for _ in bodies]
    start = threading.Barrier(len(bodies))

    def send(client: httpx.Client, body: dict[str, object]) -> httpx.Response:
        client.get("/metrics")
        start.wait(60)
        r = client.post(CHAT, json=body, headers={"x-lane": "a"})
        answered.append(r)
        return r

    try:
        with ThreadPoolExecutor(len(bodies)) as ex:
            return list(ex.map(send, clients, bodies))
    finally:
        for client in clients:
            client.close()


def test_pool_unavailable_answers_503_and_counts_the_reason(
    sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """No replica accepting connections: 503 with Retry-After, counted as pool_unavailable."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    cfg = lanes_config(tmp_path, {"p": [dead]}, [lane_spec("a")])
    sc = sidecar(config=cfg, traces=False)
    r = post_lane(sc, "a", chat_body("anyone?"))
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    (ev,) = sc.wait_events(1)
    assert (ev["status"], ev["rejection_reason"]) == (c.ERROR, c.POOL_UNAVAILABLE)
    assert rejections(sc) == {("a", c.POOL_UNAVAILABLE): 1}
