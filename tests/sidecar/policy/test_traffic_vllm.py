"""Traffic control against real `vllm serve` pools: a weighted split that keeps each client
on one arm, and a fallback pool that answers when the lane's pool refuses connections.

Pools: ``vllm`` and ``vllm_b`` (tests/conftest.py, one each per session). Requests ask for
one token, so the split's 320 requests take seconds, not minutes.
"""

from __future__ import annotations

import math
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from obs import conventions as c
from obs.engines.server import VllmServer
from obs.procs import free_port
from tests.conftest import SidecarFactory
from tests.support import MODEL, probes
from tests.support.lanes_support import lanes_config

pytestmark = pytest.mark.engine

CLIENTS = 160  # identities (API keys); each sends two requests
CANARY_SHARE = 0.05


def _binomial_bounds(n: int, p: float, z: float = 4.0) -> tuple[float, float]:
    """The count of ``n`` draws at ``p`` within ``z`` standard deviations of its mean."""
    sd = math.sqrt(n * p * (1 - p))
    return n * p - z * sd, n * p + z * sd


def _ask(base: openai.OpenAI, key: str, turn: int) -> str:
    client = base.with_options(api_key=key)
    rid = f"{key}-{turn}"
    resp = client.completions.create(
        model=MODEL, prompt=f"conversation {key} turn {turn}", max_tokens=1,
        extra_headers={"x-request-id": rid},
    )  # fmt: skip
    assert resp.choices, resp
    return rid


def test_a_95_5_split_sends_each_client_to_one_arm_in_about_that_ratio(
    vllm: VllmServer, vllm_b: VllmServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """A lane split 95/5 across two real pools: events and /metrics show both arms, the
    canary's share of clients within 4 binomial standard deviations of 5%, and every client
    (API key) keeps one arm for both its requests."""
    lane = {
        "name": "chat",
        "split": {"stable": 95, "canary": 5},
        "canary": {"sticky": "api_key"},
        "timeouts": {"connect_s": 30, "first_token_s": 120, "idle_s": 120},
    }
    config = lanes_config(tmp_path, {"stable": [vllm.url], "canary": [vllm_b.url]}, [lane])
    sc = sidecar(config=config, traces=False)
    base = openai.OpenAI(base_url=sc.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    keys = [f"client-{i}" for i in range(CLIENTS)]
    with ThreadPoolExecutor(3) as pool:
        rids = list(pool.map(lambda kt: _ask(base, *kt), [(k, t) for t in (0, 1) for k in keys]))
    events = {e["request_id"]: e for e in sc.wait_events(len(rids))}
    assert set(rids) <= set(events)
    arm_of: dict[str, set[str]] = {}
    replicas = {"stable": vllm.url, "canary": vllm_b.url}
    for rid in rids:
        ev = events[rid]
        assert ev["status"] == c.OK, ev
        assert ev["arm"] == ev["pool"] and ev["replica"] == replicas[ev["arm"]], ev
        arm_of.setdefault(rid.rsplit("-", 1)[0], set()).add(ev["arm"])
    assert all(len(arms) == 1 for arms in arm_of.values()), arm_of
    clients = Counter(next(iter(arms)) for arms in arm_of.values())
    lo, hi = _binomial_bounds(CLIENTS, CANARY_SHARE)
    assert clients["canary"] >= 1 and lo <= clients["canary"] <= hi, clients
    assert clients["stable"] + clients["canary"] == CLIENTS
    by_arm = Counter(events[r]["arm"] for r in rids)
    name = c.LANE_ARM_REQUESTS.name + "_total"
    for arm in ("stable", "canary"):
        labels = {c.LANE: "chat", c.ARM: arm, c.OUTCOME: c.OK}
        assert probes.metric(sc.url, name, **labels) == by_arm[arm]
        served = probes.metric(sc.url, c.REQUESTS.name + "_total", lane="chat", pool=arm)
        assert served == by_arm[arm]


def test_requests_fall_back_to_another_pool_when_the_lanes_pool_refuses(
    vllm: VllmServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """With the lane's pool on a closed port, streamed and whole requests are answered by the
    fallback pool (real vLLM); their events say from where and why, and the metrics count
    them."""
    closed = f"http://127.0.0.1:{free_port()}"
    lane = {
        "name": "chat",
        "pool": "primary",
        "fallback": "spare",
        "timeouts": {"connect_s": 30, "first_token_s": 120, "idle_s": 120},
    }
    config = lanes_config(tmp_path, {"primary": [closed], "spare": [vllm.url]}, [lane])
    sc = sidecar(config=config, traces=False)
    client = openai.OpenAI(base_url=sc.url + "/v1", api_key="k", max_retries=0, timeout=120)
    rids = []
    for i, stream in enumerate((False, True, False, True)):
        rid = f"fallback-{i}"
        msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": f"hello {i}"}]
        if stream:
            chunks = client.chat.completions.create(
                model=MODEL, messages=msgs, max_tokens=4, stream=True,
                extra_headers={"x-request-id": rid},
            )  # fmt: skip
            assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        else:
            resp = client.chat.completions.create(
                model=MODEL, messages=msgs, max_tokens=4,
                extra_headers={"x-request-id": rid},
            )  # fmt: skip
            assert resp.choices[0].message.content
        rids.append(rid)
    events = {e["request_id"]: e for e in sc.wait_events(len(rids))}
    for rid in rids:
        ev = events[rid]
        assert ev["status"] == c.OK and ev["http_status"] == 200, ev
        assert ev["pool"] == "spare" and ev["replica"] == vllm.url, ev
        assert ev["fallback_from"] == "primary" and ev["fallback_reason"] == "unavailable", ev
        assert ev["completion_tokens"], ev
    labels = {c.LANE: "chat", c.POOL: "primary", c.REASON: c.FALLBACK_UNAVAILABLE}
    assert probes.metric(sc.url, c.FALLBACKS.name + "_total", **labels) == len(rids)
