"""``Kept``: one computation per key at a time, kept for its ttl (the /v1/models and /metrics
answers a flood would otherwise compute once per request)."""

from __future__ import annotations

import asyncio

import pytest

from obs.sidecar.server.kept import Kept
from obs.sweep.virtual import VirtualLoop


def test_concurrent_askers_share_one_computation() -> None:
    """200 concurrent gets of one key run the computation once; with ttl 0 the next get after
    it finished computes again (never stale)."""
    calls = 0

    async def compute() -> bytes:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        return b"x"

    async def main() -> list[bytes]:
        kept: Kept[bytes] = Kept(0.0)
        got = await asyncio.gather(*(kept.get("k", compute) for _ in range(200)))
        await kept.get("k", compute)
        return got

    assert asyncio.run(main()) == [b"x"] * 200
    assert calls == 2


def test_an_answer_is_kept_its_ttl_and_a_failure_is_not() -> None:
    """Within the ttl the kept answer is returned; a failed or empty computation is not kept."""
    now = [0.0]
    kept: Kept[list[int]] = Kept(5.0, clock=lambda: now[0])
    calls = 0

    async def compute() -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("pool down")
        return [] if calls == 2 else [calls]

    async def ask() -> list[int]:
        return await kept.get("k", compute)

    with pytest.raises(RuntimeError):
        asyncio.run(ask())
    assert asyncio.run(ask()) == []  # empty: not kept
    assert asyncio.run(ask()) == [3]
    now[0] = 4.9
    assert asyncio.run(ask()) == [3] and calls == 3
    now[0] = 5.1
    assert asyncio.run(ask()) == [4]


def test_rest_spaces_computations_and_never_answers_older_than_the_request() -> None:
    """With rest 4, a get right after a computation of 1/16 s waits exactly 4/16 s (in
    virtual time: obs.sweep.virtual.VirtualLoop, the Kept's clock) and gets a new answer
    computed after it asked, never the previous one."""
    loop = VirtualLoop()
    took = 2**-4  # exact in binary: the virtual clock's sums are exact

    async def compute() -> float:
        await asyncio.sleep(took)
        return loop.time()

    async def main() -> tuple[float, float, float]:
        kept: Kept[float] = Kept(0.0, rest=4.0, clock=loop.time)
        first = await kept.get("k", compute)
        asked = loop.time()
        second = await kept.get("k", compute)
        return first, asked, second

    try:
        first, asked, second = loop.run_until_complete(main())
    finally:
        loop.close()
    assert (first, asked) == (took, took)  # the first answer, at once
    assert second == asked + 4 * took + took  # rested four times its computation, then fresh
