"""A flood of ``GET /v1/models`` (issue 38: 2,463 answers cost the pools 9,852 requests):
answered from the union kept ``CACHE_S``, so each pool is asked at most once per keep
interval, and every answer is a pool's whole current list or the one kept before it.

Many connections against the in-process sidecar, whose clock the test moves
(``tests.support.clock.ManualClock``): the keep interval is judged in the sidecar's time,
exactly, whatever the machine's speed. The pools are two ``ScriptedUpstream``s: the test
counts every ``/v1/models`` each pool receives and changes one pool's list, to see the kept
copy replaced when its interval is over; a real vLLM serves one fixed list and has no
per-request count of that route.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from obs.sidecar.relay.models_route import CACHE_S
from tests.sidecar.conftest import InprocFactory
from tests.support.clock import ManualClock
from tests.support.inproc import lane_config
from tests.support.scripted_upstream import ScriptedUpstream

pytestmark = pytest.mark.inproc

CONNECTIONS = 16
EACH = 8  # requests per connection in each round
TICK = 2**-10  # about a millisecond, exact in binary: the clock's sums are exact
BEFORE, AFTER = ("tiny", "tiny-b"), ("tiny", "tiny-b2")  # the union, before and after the change


@pytest.fixture
def second() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as up:
        up.models = ["tiny-b"]
        yield up


def test_a_models_flood_asks_each_pool_once_per_keep_interval(
    scripted: ScriptedUpstream, second: ScriptedUpstream, inproc: InprocFactory
) -> None:
    """16 connections ask /v1/models 8 times each, the sidecar's clock standing still: each pool
    is asked once. One pool's list changes: a flood a millisecond before the keep interval
    is over still gets the kept union and asks no pool; one at the interval's end gets the
    new union, each pool asked once more. Every answer is a whole union."""
    clock = ManualClock()
    sc = inproc(lane_config({"a": [scripted.url], "b": [second.url]}), clock=clock)
    asked = {p: p.gets.count("/v1/models") for p in (scripted, second)}

    def flood(_: int) -> list[tuple[str, ...]]:
        seen: list[tuple[str, ...]] = []
        with httpx.Client(base_url=sc.url, timeout=30) as client:  # one connection each
            for _ in range(EACH):
                r = client.get("/v1/models")
                assert r.status_code == 200, r.text
                seen.append(tuple(m["id"] for m in r.json()["data"]))
        return seen

    def round_() -> tuple[set[tuple[str, ...]], list[int]]:
        """The answers of one flood, and how often each pool has been asked so far."""
        with ThreadPoolExecutor(CONNECTIONS) as ex:
            answers = [a for run in ex.map(flood, range(CONNECTIONS)) for a in run]
        assert len(answers) == CONNECTIONS * EACH
        return set(answers), [p.gets.count("/v1/models") - n for p, n in asked.items()]

    assert round_() == ({BEFORE}, [1, 1])
    second.models = ["tiny-b2"]
    clock.advance(CACHE_S - TICK)
    assert round_() == ({BEFORE}, [1, 1])  # kept: its interval is not over
    clock.advance(TICK)
    assert round_() == ({AFTER}, [2, 2])  # over: one fetch per pool for the whole flood
