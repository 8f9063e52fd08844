"""A flood of ``GET /v1/models`` (issue 38: 2,463 answers cost the pools 9,852 requests):
answered from the union kept ``CACHE_S``, so each pool is asked at most once per keep
interval, and every answer is a pool's whole current list or the one kept before it.

Many connections against the in-process sidecar. The pools are two ``ScriptedUpstream``s:
the test counts every ``/v1/models`` each pool receives and changes one pool's list in the
middle of the flood, to see the kept copy replaced after its interval; a real vLLM serves
one fixed list and has no per-request count of that route.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from obs.sidecar.relay.models_route import CACHE_S
from tests.sidecar.conftest import InprocFactory
from tests.support.inproc import lane_config
from tests.support.scripted_upstream import ScriptedUpstream

CONNECTIONS = 16
MAX_FLOOD_S = 4 * CACHE_S  # the flood ends once an answer shows the change, or then
BEFORE, AFTER = ("tiny", "tiny-b"), ("tiny", "tiny-b2")  # the union, before and after the change


@pytest.fixture
def second() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as up:
        up.models = ["tiny-b"]
        yield up


def test_a_models_flood_asks_each_pool_once_per_keep_interval(
    scripted: ScriptedUpstream, second: ScriptedUpstream, inproc: InprocFactory
) -> None:
    """16 connections ask /v1/models back to back; once the first answer is in, one pool's
    list changes, and the flood goes on until an answer shows the change: each pool is asked
    at most once per keep interval of the flood (and twice at least: the copy is replaced),
    every answer is the whole union before or after the change, and no connection sees the
    old list again once it has seen the new one."""
    sc = inproc(lane_config({"a": [scripted.url], "b": [second.url]}))
    asked = {p: p.gets.count("/v1/models") for p in (scripted, second)}
    first, changed = threading.Event(), threading.Event()

    def flood(_: int) -> list[tuple[str, ...]]:
        seen: list[tuple[str, ...]] = []
        with httpx.Client(base_url=sc.url, timeout=10) as client:  # one connection each
            while not changed.is_set() and time.monotonic() - t0 < MAX_FLOOD_S:
                r = client.get("/v1/models")
                assert r.status_code == 200, r.text
                seen.append(tuple(m["id"] for m in r.json()["data"]))
                first.set()
                if seen[-1] == AFTER:
                    changed.set()
        return seen

    t0 = time.monotonic()
    with ThreadPoolExecutor(CONNECTIONS) as ex:
        runs = ex.map(flood, range(CONNECTIONS))
        assert first.wait(10), "no answer"
        second.models = ["tiny-b2"]
        answers = list(runs)
    elapsed = time.monotonic() - t0
    fetched = [p.gets.count("/v1/models") - n for p, n in asked.items()]
    total = sum(len(a) for a in answers)
    print(f"/v1/models flood: {total} answers in {elapsed:.1f} s, each pool asked {fetched}")
    assert changed.is_set(), f"the kept copy was not replaced within {MAX_FLOOD_S} s"
    assert total > 10 * CONNECTIONS  # a flood, not a trickle
    for seen in answers:
        assert set(seen) <= {BEFORE, AFTER}, set(seen)
        assert seen == sorted(seen, key=lambda a: a == AFTER)  # old, then new, never back
    for n in fetched:  # at most one fetch per keep interval; at least two (one replaced)
        assert 2 <= n <= 1 + elapsed / CACHE_S, (fetched, elapsed)
