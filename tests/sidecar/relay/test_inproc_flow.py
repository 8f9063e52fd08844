"""Rate limits on the real relay path, in process (ScriptedUpstream stands in for the pool,
which only answers; the limits are the sidecar's): a tenant's tokens are charged prompt +
max_tokens, refunded to what the usage says on finish, and a request past the limit is
answered 429 with Retry-After and x-ratelimit-* headers, recorded as a rejection by the
rate_limit gate and counted per tenant."""

from __future__ import annotations

import hashlib

import pytest

from obs import conventions as c
from obs.config import parse_config
from tests.sidecar.conftest import InprocFactory
from tests.support.inproc import request_id
from tests.support.probes import sample_sum
from tests.support.scripted_upstream import Script, ScriptedUpstream, token_frame, usage_frame

pytestmark = pytest.mark.inproc

LIMIT = 300


def test_tokens_limit_charges_refunds_and_refuses(
    scripted: ScriptedUpstream, inproc: InprocFactory
) -> None:
    """Each request is charged about 8 + 100 tokens and refunded to its usage (8 + 2): many
    fit in the minute; one asking max_tokens past what is left is refused with the headers,
    the event and the counter saying so."""
    config = parse_config(
        {
            "pools": [{"name": "p", "replicas": [scripted.url]}],
            "lanes": [{"name": "main", "pool": "p"}],
            "default_lane": "main",
            "auth": {"tenant_header": "x-tenant"},
            "tenants": {"acme": {"tokens_per_minute": LIMIT}},
        }
    )
    sc = inproc(config)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    for _ in range(10):  # 10 x (charged ~108, refunded to 10): far under the limit
        rid = request_id()
        scripted.scripts[rid] = Script(pieces=[token_frame("a"), usage_frame(8, 2)])
        r = sc.client.post(
            "/v1/chat/completions",
            json=body | {"max_tokens": 100},
            headers={"x-request-id": rid, "x-tenant": "acme"},
        )
        assert r.status_code == 200, r.text
        assert r.headers["x-ratelimit-limit-tokens"] == str(LIMIT)  # on every answer
        assert sc.event(rid)["tenant"] == "acme"
    rid = request_id()
    r = sc.client.post(
        "/v1/chat/completions",
        json=body | {"max_tokens": LIMIT},
        headers={"x-request-id": rid, "x-tenant": "acme"},
    )
    assert r.status_code == 429, r.text
    assert int(r.headers["retry-after"]) >= 1
    assert r.headers["x-ratelimit-limit-tokens"] == str(LIMIT)
    assert int(r.headers["x-ratelimit-remaining-tokens"]) < LIMIT
    assert r.json()["error"]["type"] == "RateLimitError"
    ev = sc.event(rid)
    assert ev["status"] == c.REJECTED and ev["rejection_reason"] == c.RATE_LIMIT_TOKENS
    assert ev["admission_gate"] == "rate_limit"
    page = sc.samples()
    assert sample_sum(page, c.RATE_LIMITED.series[0], tenant="acme", kind="tokens") == 1
    charged = sample_sum(page, c.RATE_LIMIT_USED.series[0], tenant="acme", kind="tokens")
    assert charged == 10 * 10  # the tokens used, as the usage said


def test_api_key_requests_limit(scripted: ScriptedUpstream, inproc: InprocFactory) -> None:
    """An API key's own requests_per_minute holds beside its tenant's (unlimited here): its
    second request in the minute is refused 429 naming the requests limit; another key of the
    same tenant is not."""
    keys = {k: hashlib.sha256(k.encode()).hexdigest() for k in ("sk-one", "sk-two")}
    config = parse_config(
        {
            "pools": [{"name": "p", "replicas": [scripted.url]}],
            "lanes": [{"name": "main", "pool": "p"}],
            "default_lane": "main",
            "auth": {
                "api_keys": [
                    {"sha256": keys["sk-one"], "tenant": "acme", "requests_per_minute": 1},
                    {"sha256": keys["sk-two"], "tenant": "acme"},
                ]
            },
        }
    )
    sc = inproc(config)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    def send(key: str) -> int:
        r = sc.client.post(
            "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
        )
        if r.status_code == 429:
            assert r.headers["x-ratelimit-limit-requests"] == "1"
            assert r.json()["error"]["type"] == "RateLimitError"
        return r.status_code

    assert [send("sk-one"), send("sk-one"), send("sk-two")] == [200, 429, 200]
