"""The rate-limit store in a real redis-server: its Lua script decides as
obs.sidecar.policy.rate_limit does, two limiters share one window, corrections land, and an
unreachable Redis fails open (counted) or closed (503) as configured."""

from __future__ import annotations

import asyncio
import random

import pytest

from obs import conventions as c
from obs.config import Config, parse_config
from obs.procs import free_port
from obs.sidecar.outcomes import RateLimited, Rejected
from obs.sidecar.policy import rate_limit as rl
from obs.sidecar.relay.rate_store import PREFIX, RateLimiter, RedisStore
from tests.support.redis_server import RedisServer


def _config(store: str, on_error: str = "open", tpm: int = 1000) -> Config:
    return parse_config(
        {
            "pools": [{"name": "p", "replicas": ["http://127.0.0.1:9"]}],
            "lanes": [{"name": "l", "pool": "p"}],
            "default_lane": "l",
            "tenants": {"acme": {"tokens_per_minute": tpm, "requests_per_minute": 1000}},
            "rate_limits": {"store": store, "on_store_error": on_error, "timeout_s": 0.2},
        }
    )


def test_lua_decides_as_python(redis_server: RedisServer) -> None:
    """Over random charges, the Redis script admits, refuses and counts exactly as the pure
    rule does on the same buckets and second."""

    async def go() -> None:
        store = RedisStore(redis_server.url, 1.0)
        counter = f"parity{random.getrandbits(32)}"
        rng = random.Random(7)
        try:
            for _ in range(60):
                lim = (rl.Limit(counter, rl.TOKENS, 500, rng.randint(1, 200)),)
                raw = await store.client.hgetall(PREFIX + lim[0].counter)
                buckets = {int(k): int(v) for k, v in raw.items()}
                d = await store.take(lim)
                want = rl.decide([buckets], lim, d.second)
                assert (d.allowed, d.used, d.blocked, d.retry_after_s) == (
                    want.allowed, want.used, want.blocked, want.retry_after_s,
                )  # fmt: skip
                if d.allowed and rng.random() < 0.5:
                    await store.correct(lim[0].counter, d.second, -rng.randint(0, lim[0].cost))
        finally:
            await store.close()

    asyncio.run(go())


def test_two_limiters_share_one_window(redis_server: RedisServer) -> None:
    """Two limiters (as two sidecars) on one Redis admit the tenant's limit between them, no
    more; the rest are refused 429 with a Retry-After."""

    async def go() -> None:
        config = _config(redis_server.url, tpm=1000)
        tenant = f"acme{random.getrandbits(16)}"
        config = config.model_copy(update={"tenants": {tenant: config.tenants["acme"]}})
        a, b = RateLimiter(config), RateLimiter(config)
        admitted, refused = 0, []
        try:
            for i in range(30):
                limiter = a if i % 2 else b
                try:
                    charge = await limiter.charge(tenant, None, 20, 80)
                except RateLimited as err:
                    refused.append(err)
                else:
                    assert charge is not None
                    admitted += 100
            assert admitted == 1000 and len(refused) == 20
            assert all(e.status == 429 and e.retry_after for e in refused)
        finally:
            await a.close()
            await b.close()

    asyncio.run(go())


@pytest.mark.inproc
@pytest.mark.parametrize("policy", ["open", "closed"])
def test_unreachable_store(policy: str) -> None:
    """Redis not answering: ``open`` admits uncounted and counts the store error, ``closed``
    refuses with 503 rate_limit_store."""
    errors: list[int] = []
    config = _config(f"redis://127.0.0.1:{free_port()}/0", policy)

    async def go() -> None:
        limiter = RateLimiter(config, store_failed=lambda: errors.append(1))
        try:
            if policy == "open":
                assert await limiter.charge("acme", None, 10, 10) is None
            else:
                with pytest.raises(Rejected) as info:
                    await limiter.charge("acme", None, 10, 10)
                assert info.value.status == 503
                assert info.value.rejection_reason == c.RATE_LIMIT_STORE
        finally:
            await limiter.close()

    asyncio.run(go())
    assert errors == [1]
