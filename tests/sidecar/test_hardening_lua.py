"""No negative cost in either store (issue 63): the Redis script and the in-process counters
charge a negative cost as nothing and never let a refund take a bucket below zero, so no
request can bank tokens for others (defence in depth: the relay refuses a negative cap first).

The Redis store against a real Redis server; the local store on its own.
"""

from __future__ import annotations

import asyncio
import random

from obs.sidecar.policy import rate_limit as rl
from obs.sidecar.relay.rate_store import PREFIX, RedisStore
from tests.support.redis_server import RedisServer

LIMIT = 1000


def test_the_redis_script_never_banks_a_negative_cost(redis_server: RedisServer) -> None:
    """A cost of -2,147,483,647 is charged as 0; a refund past what a second holds leaves it
    at 0; the next whole-limit charge fits once, then the window is full (before: the negative
    cost left 2,147,484,647 tokens)."""

    async def go() -> tuple[bool, int, bool, bool]:
        store = RedisStore(redis_server.url, 1.0)
        counter = f"bank{random.getrandbits(32)}"
        try:
            neg = await store.take((rl.Limit(counter, rl.TOKENS, LIMIT, -2147483647),))
            await store.correct(f"{counter}:tokens", neg.second, -5000)
            raw = await store.client.hgetall(PREFIX + f"{counter}:tokens")
            held = min((int(v) for v in raw.values()), default=0)
            whole = await store.take((rl.Limit(counter, rl.TOKENS, LIMIT, LIMIT),))
            more = await store.take((rl.Limit(counter, rl.TOKENS, LIMIT, 1),))
            return neg.allowed, held, whole.allowed, more.allowed
        finally:
            await store.close()

    assert asyncio.run(go()) == (True, 0, True, False)


def test_the_local_counters_never_hold_less_than_nothing() -> None:
    """A refund past what a second holds leaves it at 0: the window never holds credit."""
    counters = rl.Counters()
    lim = (rl.Limit("acme", rl.TOKENS, LIMIT, 10),)
    d = counters.take(lim, 100)
    counters.correct(lim[0].counter, d.second, -5000)
    assert counters.take((rl.Limit("acme", rl.TOKENS, LIMIT, LIMIT),), 101).allowed
    assert not counters.take((rl.Limit("acme", rl.TOKENS, LIMIT, 1),), 102).allowed
