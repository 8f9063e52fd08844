"""Tenants that no limit names (issue 63): with ``rate_limits.default`` an unlisted tenant is
limited in its own window, requests naming no tenant share one, and a client that names a
new tenant on every request runs into its address's window once past
``--max-tenants-per-client`` (before: all of them unlimited).

The in-process sidecar in front of ``ScriptedUpstream``, tenants by ``X-Tenant``; with the
counters in a real redis-server, two sidecars share an unlisted tenant's window.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from obs.config import Config, parse_config
from obs.errors import ConfigError
from tests.sidecar.conftest import InprocFactory
from tests.support.inproc import InProcessSidecar, request_id
from tests.support.redis_server import RedisServer
from tests.support.scripted_upstream import ScriptedUpstream

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _config(url: str, **rate_limits: Any) -> Config:
    return parse_config(
        {
            "pools": [{"name": "p", "replicas": [url]}],
            "lanes": [{"name": "main", "pool": "p"}],
            "default_lane": "main",
            "auth": {"tenant_header": "x-tenant"},
            "tenants": {"gold": {"requests_per_minute": 100}},
            "rate_limits": {"default": {"requests_per_minute": 2}, **rate_limits},
        }
    )


def _statuses(sc: InProcessSidecar, tenants: Sequence[str | None]) -> list[int]:
    """One chat per entry, naming that tenant (None: no ``X-Tenant``)."""
    out = []
    for tenant in tenants:
        headers = {"x-request-id": request_id()} | ({"x-tenant": tenant} if tenant else {})
        r = sc.client.post("/v1/chat/completions", json=CHAT, headers=headers)
        out.append(r.status_code)
        if r.status_code == 429:
            assert r.json()["error"]["message"].split(" is at its limit")[0] in (
                f"tenant {tenant}",
                "no tenant",
                "client 127.0.0.1",
            )
    return out


@pytest.mark.inproc
def test_unlisted_and_absent_tenants_are_under_the_default(
    scripted: ScriptedUpstream, inproc: InprocFactory
) -> None:
    """Default 2 a minute: an unlisted tenant's third request is 429 (its own window: another
    unlisted tenant is still served), requests naming no tenant share one window, and a
    listed tenant keeps its own limit."""
    sc = inproc(_config(scripted.url))
    assert _statuses(sc, ["acme", "acme", "acme"]) == [200, 200, 429]
    assert _statuses(sc, ["beta", "beta", "beta"]) == [200, 200, 429]
    assert _statuses(sc, [None, None, None]) == [200, 200, 429]
    assert _statuses(sc, ["gold"] * 5) == [200] * 5


@pytest.mark.inproc
def test_a_new_tenant_per_request_runs_into_its_address_window(
    scripted: ScriptedUpstream, inproc: InprocFactory
) -> None:
    """20 requests, each naming a tenant never seen: the address's first 8 tenants
    (``--max-tenants-per-client``) each have a window of their own, the rest share the
    address's, so 10 are served and 10 refused (before: 20 served)."""
    sc = inproc(_config(scripted.url))
    names = [f"t{i}" for i in range(20)]
    assert _statuses(sc, names) == [200] * 10 + [429] * 10


@pytest.mark.stack
def test_two_sidecars_share_an_unlisted_tenants_window_in_redis(
    scripted: ScriptedUpstream, inproc: InprocFactory, redis_server: RedisServer
) -> None:
    """With the counters in Redis, an unlisted tenant's two requests through one sidecar
    leave none for it through another."""
    config = _config(scripted.url, store=redis_server.url, on_store_error="closed")
    a, b = inproc(config), inproc(config)
    tenant = f"u{uuid.uuid4().hex[:8]}"  # a window of its own in the session's Redis
    assert _statuses(a, [tenant, tenant]) == [200, 200]
    assert _statuses(b, [tenant]) == [429]


def test_a_default_that_limits_nothing_is_refused() -> None:
    """``rate_limits.default: {}`` is a config error naming the field and what to give."""
    with pytest.raises(ConfigError) as err:
        parse_config(
            {
                "pools": [{"name": "p", "replicas": ["http://127.0.0.1:9"]}],
                "lanes": [{"name": "main", "pool": "p"}],
                "default_lane": "main",
                "rate_limits": {"default": {}},
            }
        )
    assert "rate_limits.default: it limits nothing" in str(err.value)
    assert "requests_per_minute, tokens_per_minute or both" in str(err.value)
