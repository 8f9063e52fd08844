"""Where the rate-limit counters live, and what happens when that store fails.

``LocalStore`` keeps them in this process (``obs.sidecar.policy.rate_limit.Counters``):
each process holds the whole limit. ``RedisStore`` keeps them in Redis
(``rate_limits.store: redis://HOST:PORT/DB``) and runs the same rule
(``rate_limit.decide``) in one Lua script, on Redis's own clock, so every worker and sidecar
replica shares one window and two requests racing for the last tokens cannot both win.

``RateLimiter`` charges a request before its lane's gate: a refusal is a ``RateLimited``
(429, ``Retry-After``, ``x-ratelimit-*``); an admitted request's ``Charge`` is corrected by
the tokens it used when it finishes. When Redis does not answer within
``rate_limits.timeout_s`` the config's ``on_store_error`` decides: ``open`` admits the
request uncounted (and counts ``rate_limit_store_errors_total``, which alerts), ``closed``
refuses it with 503 (``rate_limit_store``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

from obs import conventions as c
from obs.config import Config, RateLimits
from obs.sidecar.endings import outcome
from obs.sidecar.outcomes import ADMISSION, Refusal, Rejected, RelayError
from obs.sidecar.policy.rate_limit import (
    WINDOW_S,
    Charge,
    Counters,
    Decision,
    Limit,
    PromptCalibration,
    headers,
    limits_for,
    refusal,
)

log = structlog.get_logger("vllm_obs.rate_limits")
PREFIX = "vllm-obs:rl:"

# rate_limit.decide, in Lua. KEYS: the counters' hashes (field: second, value: charged).
# ARGV: limit, cost for each key. Returns {allowed, now, blocked (1-based, 0: none),
# retry_after, used...}.
TAKE = """
local now = tonumber(redis.call('TIME')[1])
local window = tonumber(ARGV[#ARGV])
local used, live = {}, {}
local blocked, worst = 0, 0
for i = 1, #KEYS do
  local limit, cost = tonumber(ARGV[2*i-1]), math.max(0, tonumber(ARGV[2*i]))
  local h = redis.call('HGETALL', KEYS[i])
  local sum, secs = 0, {}
  for j = 1, #h, 2 do
    local s, v = tonumber(h[j]), tonumber(h[j+1])
    if s <= now - window then
      redis.call('HDEL', KEYS[i], h[j])
    else
      sum = sum + v
      secs[#secs+1] = {s, v}
    end
  end
  used[i] = sum
  if sum + cost > limit then
    local wait = window
    if cost <= limit then
      table.sort(secs, function(a, b) return a[1] < b[1] end)
      local left = sum
      wait = 1
      for _, sv in ipairs(secs) do
        left = left - sv[2]
        if left + cost <= limit then
          wait = math.max(1, sv[1] + window - now)
          break
        end
      end
    end
    if wait > worst then blocked, worst = i, wait end
  end
end
if blocked > 0 then
  return {0, now, blocked, worst, unpack(used)}
end
for i = 1, #KEYS do
  local cost = math.max(0, tonumber(ARGV[2*i]))  -- never a negative cost (a bank)
  redis.call('HINCRBY', KEYS[i], now, cost)
  redis.call('EXPIRE', KEYS[i], window + 1)
  used[i] = used[i] + cost
end
return {1, now, 0, 0, unpack(used)}
"""

# A correction: add ARGV[2] to field ARGV[1] while the field is still held, never below 0.
CORRECT = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  local v = redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
  if v < 0 then
    redis.call('HSET', KEYS[1], ARGV[1], 0)
    return 0
  end
  return v
end
return 0
"""


class Store(Protocol):
    async def take(self, limits: Sequence[Limit]) -> Decision: ...
    async def correct(self, counter: str, second: int, delta: int) -> None: ...
    async def close(self) -> None: ...


class LocalStore:
    """The counters in this process, on the wall clock's seconds."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.counters = Counters()
        self.clock = clock

    async def take(self, limits: Sequence[Limit]) -> Decision:
        return self.counters.take(limits, int(self.clock()))

    async def correct(self, counter: str, second: int, delta: int) -> None:
        self.counters.correct(counter, second, delta)

    async def close(self) -> None:
        return None


class RedisStore:
    """The counters in Redis, shared by every process that names the same store."""

    def __init__(self, url: str, timeout_s: float) -> None:
        import redis.asyncio as aioredis  # only where a store is configured

        from obs.sidecar.relay.redis_replies import BoundedReplies

        self.url = url
        self.client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry_on_timeout=False,
            protocol=2,
            parser_class=BoundedReplies,  # a huge reply is refused unread (a store error)
        )
        self._take = self.client.register_script(TAKE)
        self._correct = self.client.register_script(CORRECT)
        self.timeout_s = timeout_s

    async def take(self, limits: Sequence[Limit]) -> Decision:
        keys = [PREFIX + lim.counter for lim in limits]
        args: list[int] = [n for lim in limits for n in (lim.limit, lim.cost)]
        try:
            async with asyncio.timeout(self.timeout_s * 2):
                out = await self._take(keys=keys, args=[*args, WINDOW_S])
            allowed, now, blocked, wait, *used = _reply(out, len(limits))
        except (TimeoutError, OSError, ValueError, TypeError) as e:
            raise unavailable(e) from e
        except Exception as e:  # redis-py's own errors (connection refused, reset, ...)
            raise unavailable(e) from e
        return Decision(bool(allowed), now, tuple(used), blocked - 1 if blocked else None, wait)

    async def correct(self, counter: str, second: int, delta: int) -> None:
        try:
            async with asyncio.timeout(self.timeout_s * 2):
                await self._correct(keys=[PREFIX + counter], args=[second, delta])
        except Exception as e:  # a lost correction only leaves the charge as it was
            log.warning("rate_limit_correction_lost", counter=counter, error=str(e))

    async def close(self) -> None:
        await self.client.aclose()


def _reply(out: object, n: int) -> list[int]:
    """The script's reply, checked: a list of ``4 + n`` integers (allowed 0 or 1, the second,
    the blocked index 0 to ``n``, the wait, a non-negative use per counter); anything else
    (what a server that is not this script's could answer) is a ``ValueError``, a store error,
    read no further than its length."""
    if not isinstance(out, list) or len(out) != 4 + n:
        raise ValueError(
            f"the rate-limit script answered {type(out).__name__}, not {4 + n} numbers"
        )
    if not all(type(v) is int for v in out):
        raise ValueError("the rate-limit script answered a value that is no integer")
    if out[0] not in (0, 1) or not 0 <= out[2] <= n or min(out[3:], default=0) < 0:
        raise ValueError(f"the rate-limit script answered values out of range: {out[:4]}")
    return out


def unavailable(err: Exception) -> RelayError:
    """The store did not answer: 503 ``rate_limit_store`` when the config fails closed."""
    why = f"{type(err).__name__}: {err}"
    msg = f"the rate-limit store did not answer ({why}); try again shortly"
    return outcome(Refusal(503, msg, c.RATE_LIMIT_STORE, ADMISSION, 1))


class RateLimiter:
    """Charges each request to its tenant's and API key's limits, in the configured store."""

    def __init__(
        self,
        config: Config,
        store: Store | None = None,
        store_failed: Callable[[], None] = lambda: None,
    ) -> None:
        self.config = config
        self.policy: RateLimits = config.rate_limits
        self.enabled = (
            bool(config.tenants)
            or config.rate_limits.default is not None
            or any(k.requests_per_minute or k.tokens_per_minute for k in config.auth.api_keys)
        )
        self.store: Store = store or (
            RedisStore(self.policy.store, self.policy.timeout_s)
            if self.policy.store
            else LocalStore()
        )
        self.store_failed = store_failed  # counts rate_limit_store_errors_total
        self.calibration = PromptCalibration()

    async def charge(
        self,
        tenant: str | None,
        key_hash: str | None,
        prompt_tokens: int,
        max_tokens: int | None,
        share_key: str | None = None,
    ) -> Charge | None:
        """Charge the request (None: nothing limits it, or the store failed open); ``share_key``
        is what fair share counts it under (an unlisted tenant's default limit); raises
        ``RateLimited`` (429) or ``Rejected`` ``rate_limit_store`` (503, failing closed)."""
        if not self.enabled:
            return None
        scaled = self.calibration.scale(prompt_tokens)
        limits = limits_for(self.config, tenant, key_hash, scaled, max_tokens, share_key)
        if not limits:
            return None
        try:
            d = await self.store.take(limits)
        except Rejected as err:  # the store's: rate_limit_store
            self.store_failed()
            log.warning(
                "rate_limit_store_unavailable", error=str(err), policy=self.policy.on_store_error
            )
            if self.policy.on_store_error == "closed":
                raise
            return None
        if not d.allowed:
            raise outcome(refusal(limits, d))  # policy's decision, the outcome made once
        return Charge(limits, d.second, prompt_tokens, tuple(headers(limits, d)))

    async def settle(self, charge: Charge, used_tokens: int, prompt_tokens: int = 0) -> None:
        """Correct the token counters to what the finished request used (and learn how the
        pool counts prompts from its ``prompt_tokens``)."""
        self.calibration.learn(charge.prompt_estimate, prompt_tokens)
        for counter, delta in charge.corrections(used_tokens):
            await self.store.correct(counter, charge.second, delta)

    async def close(self) -> None:
        await self.store.close()
