"""Per-tenant and per-key rate limits: obs.sidecar.policy.rate_limit's sliding window (pure,
with hypothesis), its limits from the config, its 429's headers, and the limiter's in-process
store charging and correcting."""

from __future__ import annotations

import asyncio
import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from obs import conventions as c
from obs.config import Config, parse_config
from obs.sidecar.outcomes import RateLimited, refused
from obs.sidecar.policy import rate_limit as rl
from obs.sidecar.relay.rate_store import LocalStore, RateLimiter

KEY = "sk-test-1"
KEY_HASH = hashlib.sha256(KEY.encode()).hexdigest()


def _config(**extra: object) -> Config:
    return parse_config(
        {
            "pools": [{"name": "p", "replicas": ["http://127.0.0.1:9"]}],
            "lanes": [{"name": "l", "pool": "p"}],
            "default_lane": "l",
            **extra,
        }
    )


def test_limits_for_tenant_and_key() -> None:
    """A request is charged to its tenant's limits and its API key's, tokens = prompt + max."""
    config = _config(
        tenants={"acme": {"tokens_per_minute": 1000, "requests_per_minute": 5}},
        auth={"api_keys": [{"sha256": KEY_HASH, "tenant": "acme", "requests_per_minute": 2}]},
    )
    limits = rl.limits_for(config, "acme", KEY_HASH, 30, 70)
    assert [(x.counter, x.limit, x.cost) for x in limits] == [
        ("tenant:acme:requests", 5, 1),
        ("tenant:acme:tokens", 1000, 100),
        (f"key:{KEY_HASH[:16]}:requests", 2, 1),
    ]
    assert rl.limits_for(config, "other", None, 30, 70) == ()


def test_refusal_names_retry_and_headers() -> None:
    """A counter at its limit refuses with the seconds until its oldest charge leaves the
    window, and OpenAI-style x-ratelimit-* headers."""
    counters = rl.Counters()
    lim = (rl.Limit("tenant:a", rl.TOKENS, 100, 60),)
    assert counters.take(lim, 1000).allowed
    d = counters.take(lim, 1010)
    assert not d.allowed and d.blocked == 0 and d.retry_after_s == 50
    r = rl.refusal(lim, d)  # the decision; its outcome answers it
    assert (r.status, r.reason, r.retry_after) == (429, c.RATE_LIMIT_TOKENS, 50)
    h = dict(refused(r).headers())
    assert h[b"retry-after"] == b"50"
    assert h[b"x-ratelimit-limit-tokens"] == b"100"
    assert h[b"x-ratelimit-remaining-tokens"] == b"40"
    assert h[b"x-ratelimit-reset-tokens"] == b"50s"
    assert counters.take(lim, 1060).allowed  # the first charge left the window


def test_cost_over_whole_limit_never_fits() -> None:
    """A request costing more than the whole limit is refused with a minute's Retry-After and
    a message saying it can never fit."""
    lim = (rl.Limit("tenant:a", rl.TOKENS, 100, 150),)
    d = rl.Counters().take(lim, 5)
    assert not d.allowed and d.retry_after_s == rl.WINDOW_S
    assert "whole limit" in rl.refusal(lim, d).detail


def test_all_or_none() -> None:
    """A request refused by one counter charges none of the others."""
    counters = rl.Counters()
    req = rl.Limit("tenant:a", rl.REQUESTS, 10, 1)
    tok = rl.Limit("tenant:a", rl.TOKENS, 50, 60)
    assert not counters.take((req, tok), 0).allowed
    assert rl.window_use(counters.buckets["tenant:a:requests"], 0) == 0


def test_reset_text() -> None:
    """Reset times are written as OpenAI writes them."""
    assert [rl.reset_text(s) for s in (0, 1, 59, 60, 361)] == ["0s", "1s", "59s", "1m0s", "6m1s"]


@settings(max_examples=200, deadline=None)
@given(
    limit=st.integers(1, 500),
    steps=st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 200), st.integers(0, 200)),
        min_size=1,
        max_size=80,
    ),
)
def test_window_never_holds_more_than_limit(limit: int, steps: list[tuple[int, int, int]]) -> None:
    """Whatever arrives, and however the charges are corrected down on finish, no 60 s window
    (at one-second grain) admits more than the limit."""
    counters = rl.Counters()
    lim_kind = rl.TOKENS
    now = 0
    charged: dict[int, int] = {}
    for gap, cost, used in steps:
        now += gap
        lim = (rl.Limit("t", lim_kind, limit, cost),)
        d = counters.take(lim, now)
        if d.allowed:
            real = min(used, cost)  # finishing corrects down to what was used
            counters.correct("t:tokens", d.second, real - cost)
            charged[now] = charged.get(now, 0) + real
        else:
            assert d.retry_after_s >= 1
            if cost <= limit:  # retrying after the wait fits (no one else charged meanwhile)
                probe = rl.Counters()
                probe.buckets = {"t:tokens": dict(counters.buckets["t:tokens"])}
                assert probe.take(lim, now + d.retry_after_s).allowed
        for end in range(now - 60, now + 1):
            assert sum(v for s, v in charged.items() if end - 60 < s <= end) <= limit


def test_limiter_charges_and_corrects() -> None:
    """The in-process limiter charges prompt + max_tokens, refunds the unused completion on
    settle, and refuses what the window cannot hold."""
    config = _config(tenants={"acme": {"tokens_per_minute": 300}})
    now = [1000.0]
    limiter = RateLimiter(config, LocalStore(lambda: now[0]))

    async def go() -> None:
        charge = await limiter.charge("acme", None, 50, 200)
        assert charge is not None
        await limiter.settle(charge, 60)  # used 60 of the 250 charged
        assert await limiter.charge("acme", None, 40, 200) is not None  # 60 + 240 = 300
        try:
            await limiter.charge("acme", None, 1, 0)
        except RateLimited as err:
            assert err.retry_after == 60
        else:
            raise AssertionError("the 301st token was admitted")
        assert await limiter.charge(None, None, 1000, 1000) is None  # no tenant: no limit

    asyncio.run(go())


def test_prompt_calibration_learns_the_pools_count() -> None:
    """When the pool counts more prompt tokens than the sidecar estimated, later charges
    scale the estimate by the learned ratio (bounded), so admissions do not overshoot."""
    config = _config(tenants={"acme": {"tokens_per_minute": 100_000}})
    limiter = RateLimiter(config, LocalStore(lambda: 0.0))

    async def go() -> None:
        for _ in range(30):
            charge = await limiter.charge("acme", None, 100, 0)
            assert charge is not None and charge.prompt_estimate == 100
            await limiter.settle(charge, 150, prompt_tokens=150)
        charge = await limiter.charge("acme", None, 100, 10)
        assert charge is not None
        assert [lim.cost for lim in charge.limits] == [160]  # 100 x 1.5 + 10

    asyncio.run(go())
    cal = rl.PromptCalibration()
    for _ in range(100):
        cal.learn(1, 1000)
    assert cal.ratio <= rl.PromptCalibration.BOUNDS[1]
