"""The per-lane series exist at 0 before a lane's first request, on every pool it may use.

Prometheus's ``rate()`` reads nothing from a series' first sample: a series born at 1 hides
the lane's first request from its SLO rules. The pools are ``ScriptedUpstream`` (fakes in this
process, which serve no model on ``/metrics``); a model learned from a real vLLM's page is in
test_sidecar_vllm.py.
"""

from __future__ import annotations

import orjson
import pytest

from obs import conventions as c
from obs.config import parse_config
from tests.sidecar.conftest import InprocFactory
from tests.support import chat_body
from tests.support.inproc import request_id
from tests.support.probes import CHAT, DONE_FRAME
from tests.support.scripted_upstream import Script, ScriptedUpstream, token_frame

pytestmark = pytest.mark.inproc

SERIES = (c.TTFT, c.TPOT, c.REQUEST_DURATION)


def _config(url: str) -> object:
    """Three pools: ``main`` alone on ``a``, ``canary`` split over ``a``/``b`` with fallback ``c``;
    pool ``a`` names its model, the others do not."""
    return parse_config(
        {
            "pools": [
                {"name": "a", "replicas": [url], "model": "tiny"},
                {"name": "b", "replicas": [url]},
                {"name": "c", "replicas": [url]},
            ],
            "lanes": [
                {"name": "main", "pool": "a"},
                {
                    "name": "canary",
                    "split": {"a": 90, "b": 10},
                    "fallback": "c",
                    "match": [{"header": {"x-lane": "canary"}}],
                },
            ],
            "default_lane": "main",
        },
        "<test>",
    )


def test_every_lane_and_pool_it_may_use_counts_from_zero(
    scripted: ScriptedUpstream, inproc: InprocFactory
) -> None:
    """Before any request: latency histograms per (lane, pool) for its pool, arms and fallback,
    and the request counts (ok by stop/length, error) for a configured model, all at 0."""
    sc = inproc(_config(scripted.url))
    s = sc.samples()
    want = {("main", "a"), ("canary", "a"), ("canary", "b"), ("canary", "c")}
    for m in SERIES:
        counts = {(lb[c.LANE], lb[c.POOL]): v for lb, v in s[m.name + "_count"]}
        assert counts == dict.fromkeys(want, 0.0), m.name
    requests = {
        (lb[c.LANE], lb[c.POOL], lb[c.MODEL], lb[c.OUTCOME], lb[c.FINISH_REASON]): v
        for lb, v in s[c.REQUESTS.name + "_total"]
    }
    assert requests == {
        (lane, "a", "tiny", outcome, finish): 0.0
        for lane in ("main", "canary")
        for outcome, finish in ((c.OK, "stop"), (c.OK, "length"), (c.ERROR, "none"))
    }


def test_a_request_adds_to_the_primed_series(
    scripted: ScriptedUpstream, inproc: InprocFactory
) -> None:
    """The first request lands on the series that were at 0 (no second series beside them)."""
    sc = inproc(_config(scripted.url))
    rid = request_id()
    scripted.scripts[rid] = Script(pieces=[token_frame("a"), token_frame(" b", "stop"), DONE_FRAME])
    body = chat_body(stream=True)
    r = sc.client.post(CHAT, content=orjson.dumps(body), headers={"x-request-id": rid})
    assert r.status_code == 200
    assert sc.event(rid)["status"] == c.OK
    s = sc.samples()
    main = [(lb, v) for lb, v in s[c.REQUESTS.name + "_total"] if lb[c.LANE] == "main"]
    assert sorted((lb[c.OUTCOME], lb[c.FINISH_REASON], v) for lb, v in main) == [
        (c.ERROR, "none", 0.0),
        (c.OK, "length", 0.0),
        (c.OK, "stop", 1.0),
    ]
    ttft = {(lb[c.LANE], lb[c.POOL]): v for lb, v in s[c.TTFT.name + "_count"]}
    assert ttft[("main", "a")] == 1.0 and ttft[("canary", "a")] == 0.0


def test_the_page_has_the_process_and_collector_series(
    scripted: ScriptedUpstream, inproc: InprocFactory
) -> None:
    """/metrics carries the sidecar process's CPU, memory and descriptors and the cycle
    collector's passes and frees by generation (prometheus_client's standard names)."""
    s = inproc(_config(scripted.url)).samples()
    (cpu,) = s["process_cpu_seconds_total"]
    assert cpu[1] > 0
    assert s["process_resident_memory_bytes"][0][1] > 0 and s["process_open_fds"][0][1] > 0
    gens = {lb["generation"] for lb, _ in s["python_gc_collections_total"]}
    assert gens == {"0", "1", "2"}
    assert {lb["generation"] for lb, _ in s["python_gc_objects_collected_total"]} == gens
