"""Per-tenant and per-API-key rate limits: requests and tokens in any minute.

Each limited counter (a tenant's or a key's requests, or its tokens) is a sliding window of
60 one-second buckets: a request is admitted when, for every counter it is charged to, what
the last 60 seconds hold plus its cost stays within the limit; then its cost is added to the
current second of each (all or none). Tokens are charged as the prompt's estimate plus
``max_tokens`` on admission (``output_estimate``: without a cap, the context left; a cost is
never below zero), and corrected to the tokens the request really used when it
finishes (``Charge.correction``), in the bucket it was charged to. So in any 60 seconds, at
one-second grain, a counter admits at most its limit.

A refused request learns how long until it would fit: the seconds until enough of the
oldest buckets leave the window (``retry_after_s``); a cost above the whole limit never fits
and is told to retry in a minute.

``Counters`` is the in-process store (each process holds the whole limit); the Redis store
(``obs.sidecar.relay.rate_store``) runs the same rule in one Lua script, so every worker
and sidecar replica shares one window. Pure bookkeeping: no I/O, times passed in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from obs import conventions as c
from obs.config import Config
from obs.sidecar.outcomes import ADMISSION, Refusal

WINDOW_S = 60
ABSENT_CONTEXT = 4096  # a request without an output cap, on pools that declare no max_model_len
REQUESTS = "requests"
TOKENS = "tokens"
KINDS = (REQUESTS, TOKENS)


@dataclass(frozen=True, slots=True)
class Limit:
    """One counter a request is charged to: ``counter`` (``tenant:NAME:tokens``), its limit
    per minute and the request's cost."""

    scope: str  # tenant:NAME or key:HASH
    kind: str  # requests or tokens
    limit: int
    cost: int

    @property
    def counter(self) -> str:
        return f"{self.scope}:{self.kind}"


@dataclass(frozen=True, slots=True)
class Decision:
    """What the store decided: ``allowed``, the second the costs were charged to, each
    counter's use in the window (after the charge when allowed), and when refused the
    counter that refused and the seconds until the request would fit."""

    allowed: bool
    second: int
    used: tuple[int, ...]
    blocked: int | None = None  # index into the limits
    retry_after_s: int = 0


def output_estimate(config: Config, prompt_tokens: int, max_tokens: int | None) -> int:
    """The output tokens a request is charged for: its cap, or without one (None, a
    generating route) what the engine would let it generate, the context left after its
    prompt (the pools' largest declared ``max_model_len``, else ``ABSENT_CONTEXT``). Never
    below zero."""
    if max_tokens is not None:
        return max(0, max_tokens)
    lens = [p.declared.max_model_len for p in config.pools if p.declared is not None]
    context = max((n for n in lens if n is not None), default=ABSENT_CONTEXT)
    return max(1, context - max(0, prompt_tokens))


def default_scope(tenant: str | None, share_key: str | None) -> str:
    """The counter of a tenant that ``tenants:`` does not name, under ``rate_limits.default``:
    the tenant's own; ``client ADDRESS``'s when the tenant is one past what its address may
    bring (``share_key``: ``obs.sidecar.policy.auth.Tenants.share_key``), so naming a new
    tenant on every request is no way out of the limit; one for every request naming none."""
    if tenant is None:
        return "no tenant"
    if share_key and share_key != tenant:
        return share_key  # "client ADDRESS"
    return f"tenant:{tenant}"


def limits_for(
    config: Config,
    tenant: str | None,
    key_hash: str | None,
    prompt_tokens: int,
    max_tokens: int | None,
    share_key: str | None = None,
) -> tuple[Limit, ...]:
    """The counters a request is charged to: its tenant's (or, unlisted, the configured
    default's: ``default_scope``) and its API key's configured limits (none when neither is
    limited). The token cost is the prompt's estimate plus ``output_estimate``, never below
    zero. Without a cap, an estimate past a counter's whole limit is charged as the limit (the
    request waits for an empty window, and is corrected to what it used: it is not refused
    for what it might generate)."""
    out: list[Limit] = []
    tokens = max(0, prompt_tokens) + output_estimate(config, prompt_tokens, max_tokens)
    scopes: list[tuple[str, object]] = []
    if tenant is not None and tenant in config.tenants:
        scopes.append((f"tenant:{tenant}", config.tenants[tenant]))
    elif config.rate_limits.default is not None:
        scopes.append((default_scope(tenant, share_key), config.rate_limits.default))
    if key_hash is not None:
        key = next((k for k in config.auth.api_keys if k.sha256 == key_hash), None)
        if key is not None:
            scopes.append((f"key:{key_hash[:16]}", key))
    for scope, block in scopes:
        rpm = getattr(block, "requests_per_minute", None)
        tpm = getattr(block, "tokens_per_minute", None)
        if rpm is not None:
            out.append(Limit(scope, REQUESTS, rpm, 1))
        if tpm is not None:
            cost = tokens if max_tokens is not None else min(tokens, tpm)
            out.append(Limit(scope, TOKENS, tpm, cost))
    return tuple(out)


def window_use(buckets: Mapping[int, int], now_s: int) -> int:
    """What a counter's buckets hold within the window ending at second ``now_s``."""
    return sum(v for s, v in buckets.items() if s > now_s - WINDOW_S)


def retry_after(buckets: Mapping[int, int], now_s: int, limit: int, cost: int) -> int:
    """Seconds until ``cost`` fits under ``limit`` as the oldest buckets leave the window
    (a minute when it never fits: the cost alone is over the limit)."""
    if cost > limit:
        return WINDOW_S
    live = sorted((s, v) for s, v in buckets.items() if s > now_s - WINDOW_S)
    left = sum(v for _, v in live)
    for s, v in live:
        left -= v
        if left + cost <= limit:
            return max(1, s + WINDOW_S - now_s)
    return 1  # already fits (only a refused counter is asked)


def decide(windows: Sequence[Mapping[int, int]], limits: Sequence[Limit], now_s: int) -> Decision:
    """The rule both stores run, over each limit's buckets: admit when every counter has
    room; else refuse, naming the counter that frees last."""
    used = [window_use(w, now_s) for w in windows]
    blocked, worst = None, 0
    for i, (lim, u) in enumerate(zip(limits, used, strict=True)):
        if u + lim.cost > lim.limit:
            wait = retry_after(windows[i], now_s, lim.limit, lim.cost)
            if wait > worst:
                blocked, worst = i, wait
    if blocked is not None:
        return Decision(False, now_s, tuple(used), blocked, worst)
    return Decision(True, now_s, tuple(u + lim.cost for u, lim in zip(used, limits, strict=True)))


class Counters:
    """The in-process store: each counter's buckets, by name."""

    def __init__(self) -> None:
        self.buckets: dict[str, dict[int, int]] = {}

    def take(self, limits: Sequence[Limit], now_s: int) -> Decision:
        """Charge every limit's cost at second ``now_s`` if all fit (``decide``)."""
        windows = [self._live(lim.counter, now_s) for lim in limits]
        d = decide(windows, limits, now_s)
        if d.allowed:
            for lim, w in zip(limits, windows, strict=True):
                w[now_s] = w.get(now_s, 0) + lim.cost
        return d

    def correct(self, counter: str, second: int, delta: int) -> None:
        """Add ``delta`` (negative: a refund) to what ``second`` charged ``counter``, while
        that second is still held."""
        w = self.buckets.get(counter)
        if w is not None and second in w:
            w[second] = max(0, w[second] + delta)  # a bucket never holds less than nothing

    def _live(self, counter: str, now_s: int) -> dict[int, int]:
        w = self.buckets.setdefault(counter, {})
        for s in [s for s in w if s <= now_s - WINDOW_S]:
            del w[s]
        return w


@dataclass(frozen=True, slots=True)
class Charge:
    """What an admitted request was charged: its limits and the second, to correct the
    token counters by what it really used when it finishes."""

    limits: tuple[Limit, ...]
    second: int
    prompt_estimate: int = 0  # the prompt tokens the sidecar estimated (before calibration)
    # x-ratelimit-* as the charge left them, sent with the pool's answer (OpenAI sends them on
    # every response).
    rate_headers: tuple[tuple[bytes, bytes], ...] = ()

    def corrections(self, used_tokens: int) -> list[tuple[str, int]]:
        """(counter, delta) for each token counter: the tokens used minus those charged."""
        used = max(0, used_tokens)
        return [
            (lim.counter, used - lim.cost)
            for lim in self.limits
            if lim.kind == TOKENS and used != lim.cost
        ]


def reset_text(seconds: float) -> str:
    """A reset time as OpenAI's ``x-ratelimit-reset-*`` headers write it: ``1s``, ``6m0s``."""
    s = max(0, round(seconds))
    return f"{s // 60}m{s % 60}s" if s >= 60 else f"{s}s"


def headers(limits: Sequence[Limit], d: Decision) -> list[tuple[bytes, bytes]]:
    """OpenAI-style ``x-ratelimit-*`` headers for the tightest counter of each kind."""
    out: list[tuple[bytes, bytes]] = []
    for kind in KINDS:
        mine = [(lim, u) for lim, u in zip(limits, d.used, strict=True) if lim.kind == kind]
        if not mine:
            continue
        lim, u = min(mine, key=lambda p: p[0].limit - p[1])
        remaining = max(0, lim.limit - u)
        reset = d.retry_after_s if not d.allowed and d.blocked is not None else WINDOW_S
        out += [
            (f"x-ratelimit-limit-{kind}".encode(), str(lim.limit).encode()),
            (f"x-ratelimit-remaining-{kind}".encode(), str(remaining).encode()),
            (f"x-ratelimit-reset-{kind}".encode(), reset_text(reset).encode()),
        ]
    return out


class PromptCalibration:
    """How many tokens the pool counts per token the sidecar estimates from a prompt's
    characters (``obs.lanes``: four characters a token; code and other languages run
    denser), learned from finished requests' usage as a moving average and applied to the
    prompt part of each charge, so admissions on estimates do not overshoot the limit."""

    ALPHA = 0.2
    BOUNDS = (0.25, 4.0)

    def __init__(self) -> None:
        self.ratio = 1.0

    def scale(self, estimate: int) -> int:
        return math.ceil(estimate * self.ratio)

    def learn(self, estimate: int, actual: int) -> None:
        if estimate > 0 and actual > 0:
            seen = min(max(actual / estimate, self.BOUNDS[0]), self.BOUNDS[1])
            self.ratio += self.ALPHA * (seen - self.ratio)


def refusal(limits: Sequence[Limit], d: Decision) -> Refusal:
    """The 429 of a refused request: which counter refused, when to retry, and the headers."""
    assert d.blocked is not None
    lim = limits[d.blocked]
    who = lim.scope.replace(":", " ", 1)
    if lim.cost > lim.limit:
        msg = (
            f"the request needs about {lim.cost} {lim.kind}, more than {who}'s whole limit "
            f"of {lim.limit} per minute"
        )
    else:
        msg = (
            f"{who} is at its limit of {lim.limit} {lim.kind} per minute "
            f"({d.used[d.blocked]} used); retry in {d.retry_after_s} s"
        )
    reason = c.RATE_LIMIT_TOKENS if lim.kind == TOKENS else c.RATE_LIMIT_REQUESTS
    return Refusal(429, msg, reason, ADMISSION, d.retry_after_s, tuple(headers(limits, d)))
