"""``GET /v1/models`` through the sidecar: the union of the pools' model lists.

Each pool is asked at its first replica that answers. Client auth applies as on the
relayed routes. A pool with its own key gets that key; the client's ``Authorization``
goes only to a pool without one, and only when the sidecar does not check client keys
itself.

The union is kept ``CACHE_S`` (``ModelsCache``), per set of headers the pools are asked
with, and requests that arrive while it is being fetched wait for that one fetch: a flood of
``/v1/models`` costs the pools one round of requests every ``CACHE_S``, not one per request.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import orjson

from obs.sidecar.policy.auth import Tenants
from obs.sidecar.pools.pools import PoolSet

MODELS_TIMEOUT_S = 5.0
CACHE_S = 5.0
CACHE_KEYS = 64  # header sets kept (one per client key when client keys are forwarded)

Models = list[dict[str, Any]]


class ModelsCache:
    """The last union per key for ``ttl_s``; one fetch at a time per key (see the module doc)."""

    def __init__(self, ttl_s: float = CACHE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._kept: OrderedDict[str, tuple[float, Models]] = OrderedDict()
        self._fetching: dict[str, asyncio.Task[Models]] = {}

    async def get(self, key: str, fetch: Callable[[], Awaitable[Models]]) -> Models:
        kept = self._kept.get(key)
        if kept is not None and kept[0] > self.clock():
            return kept[1]
        task = self._fetching.get(key)
        if task is None:
            task = asyncio.ensure_future(fetch())
            self._fetching[key] = task
            task.add_done_callback(lambda t: self._fetched(key, t))
        return await asyncio.shield(task)

    def _fetched(self, key: str, task: asyncio.Task[Models]) -> None:
        self._fetching.pop(key, None)
        if task.cancelled() or task.exception() is not None or not task.result():
            return  # nothing kept: the next request asks again
        self._kept[key] = (self.clock() + self.ttl_s, task.result())
        self._kept.move_to_end(key)
        while len(self._kept) > CACHE_KEYS:
            self._kept.popitem(last=False)


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
