"""``GET /v1/models`` through the sidecar: the union of the pools' model lists.

Each pool is asked at its first replica that answers. Client auth applies as on the
relayed routes. A pool with its own key gets that key; the client's ``Authorization``
goes only to a pool without one, and only when the sidecar does not check client keys
itself.

The union is kept ``CACHE_S`` (``obs.sidecar.server.kept.Kept``), per set of headers the
pools are asked with, and requests that arrive while it is being fetched wait for that one
fetch: a flood of ``/v1/models`` costs the pools one round of requests every ``CACHE_S``,
not one per request.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import orjson

from obs.sidecar.policy.auth import Tenants
from obs.sidecar.pools.pools import PoolSet
from obs.sidecar.server.kept import Kept

MODELS_TIMEOUT_S = 5.0
CACHE_S = 5.0
CACHE_KEYS = 64  # header sets kept (one per client key when client keys are forwarded)


def models_cache(clock: Callable[[], float] = time.monotonic) -> Kept[list[dict[str, Any]]]:
    """Where the unions are kept (see the module's doc), their age read on ``clock``."""
    return Kept(CACHE_S, CACHE_KEYS, clock=clock)


def upstream_headers(
    pool: str, headers: Mapping[str, str], pool_keys: Mapping[str, str], tenants: Tenants
) -> dict[str, str]:
    """The headers a pool's ``/v1/models`` is asked with (see the module docstring)."""
    if pool_keys.get(pool):
        return {"authorization": f"Bearer {pool_keys[pool]}"}
    if "authorization" in headers and not tenants.checks_keys:
        return {"authorization": headers["authorization"]}
    return {}


async def union_models(
    session: aiohttp.ClientSession,
    pools: PoolSet,
    headers: Mapping[str, str],
    pool_keys: Mapping[str, str],
    tenants: Tenants,
) -> list[dict[str, Any]]:
    """Every model the pools list, first listing of an id wins; empty if none answered."""
    seen: dict[str, dict[str, Any]] = {}
    timeout = aiohttp.ClientTimeout(total=MODELS_TIMEOUT_S)
    for pool in pools.health():
        up = upstream_headers(pool, headers, pool_keys, tenants)
        for replica in pools.candidates(pool):
            try:
                async with session.get(
                    f"{replica.url}/v1/models", headers=up, timeout=timeout
                ) as resp:
                    if resp.status != 200:
                        continue
                    data = orjson.loads(await resp.read())
            except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
                continue
            for m in data.get("data", []) if isinstance(data, dict) else []:
                if isinstance(m, dict) and isinstance(m.get("id"), str):
                    seen.setdefault(m["id"], m)
            break
    return list(seen.values())


async def cached_union(
    cache: Kept[list[dict[str, Any]]],
    session: aiohttp.ClientSession,
    pools: PoolSet,
    headers: Mapping[str, str],
    pool_keys: Mapping[str, str],
    tenants: Tenants,
) -> list[dict[str, Any]]:
    """``union_models`` kept in ``cache`` per set of headers the pools are asked with."""
    asked = [upstream_headers(p, headers, pool_keys, tenants) for p in pools.health()]
    return await cache.get(
        repr(asked), lambda: union_models(session, pools, headers, pool_keys, tenants)
    )
