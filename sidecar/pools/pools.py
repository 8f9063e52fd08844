"""The pools' replicas: choosing one, tracking health, and polling engine state.

Health is passive and active: a connect failure marks a replica unhealthy at
once; the monitor polls each replica's ``/metrics`` every ``interval`` and
marks it healthy again (and keeps its engine state) when it answers. A pool
whose replicas are all unhealthy is still tried, so traffic resumes on the
first request after the engine is back, without waiting for a poll.

A pool that serves no ``/metrics`` (``metrics: false``: a hosted OpenAI-compatible API as a
fallback) is probed instead: a GET of its ``health.path``, where any answer below 500 is up
(no engine state, no settings).

A replica that accepts the poll's connection but answers late is busy, not down: a
saturated engine starves its API server, and /metrics answers seconds late exactly
when its KV cache is full. It keeps its health and its last engine state through
``SLOW_POLLS_TOLERATED`` late polls in a row; the next one marks it down (a frozen
engine). A refused or timed-out connection marks it down at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from hashlib import blake2b

import aiohttp
import structlog

from obs import conventions as c
from obs.config import Config
from obs.engines.adapters import AUTO, unknown_state
from obs.engines.metrics import EngineState
from obs.events import Event
from obs.phases import Clock
from obs.served import Served
from obs.sidecar.policy.saturation import ReplicaView
from obs.sidecar.pools.engine_scrape import ExpositionError, read_state
from obs.sidecar.pools.occupancy import Held, Occupancy
from obs.sidecar.pools.served_poll import SettingsPoll

log = structlog.get_logger("vllm_obs.pools")

# Consistent hashing with bounded loads: a replica takes its keys while it holds fewer
# than FACTOR x the pool's mean outstanding requests + SLACK. The slack keeps small
# pools from spilling on every short burst: a cache hit is worth a few queued requests.
AFFINITY_LOAD_FACTOR = 1.5
AFFINITY_LOAD_SLACK = 4
SLOW_POLLS_TOLERATED = 2
COLD_HEALTHY, COLD_FIRST_TOKEN = c.COLD_START_STAGES


def _weight(key: str, url: str) -> bytes:
    return blake2b(f"{key}|{url}".encode(), digest_size=8).digest()


@dataclass(slots=True)
class Replica:
    pool: str
    url: str
    engine: str = "auto"  # the pool's configured engine (obs.engines), or auto
    outstanding: int = 0
    healthy: bool = True
    state: EngineState | None = None
    failures: int = 0
    slow_polls: int = 0  # late /metrics answers in a row (the connection was accepted)
    served: Served | None = None  # engine, version and settings it last reported
    ahead_tokens: int = 0  # estimated prompt tokens of the requests outstanding here
    sent_tokens: int = 0  # estimated prompt tokens of every request sent here, ever
    sent: int = 0  # requests sent here, ever
    preempting: bool = False  # its engine preempted requests between the last two polls
    read_at: float | None = None  # monotonic time its engine state was last read
    # A pool without /metrics (``metrics: false``, a hosted API): the path its health probe
    # GETs instead; None reads /metrics.
    probe: str | None = None
    # Cold starts: when it was first seen down (None: up), when it came back and has served
    # no token yet, how many times it came back, and its last cold start per stage (seconds).
    down_since: float | None = None
    back_since: float | None = None
    cold_starts: int = 0
    cold_start_s: dict[str, float] = field(default_factory=dict)
    occupancy: Occupancy = field(default_factory=Occupancy)  # who holds it, by lane

    def lease(
        self, prompt_tokens: int = 0, ev: Event | None = None, clock: Clock | None = None
    ) -> Lease:
        """One request outstanding on this replica while the ``with`` block runs
        (least-outstanding routing reads the count), however the block ends. With ``ev``, the
        prompt tokens sent here meanwhile, and how many requests, go on it
        (``pool_prompt_tokens_during``, ``pool_requests_during``: others' prefills); with its
        ``clock`` too, it is held by its lane and tenant (``occupancy``)."""
        return Lease(self, prompt_tokens, ev, clock)

    def stamp_dispatch(self, ev: Event) -> None:
        """The replica's state as a request is sent to it, on the request's event (its
        ``pool_*`` fields, which ``obs.engine_queue`` reads when the engine sends no span)."""
        ev.pool_in_flight, ev.pool_ahead_prompt_tokens = self.outstanding, self.ahead_tokens
        ev.pool_max_running = None if self.served is None else self.served.max_running
        st = self.state
        ev.pool_waiting = None if st is None or st.waiting is None else int(st.waiting)
        ev.pool_kv_usage = None if st is None else st.kv_cache_usage
        ev.pool_preempting = None if st is None or st.preemptions is None else self.preempting


class Lease:
    """``Replica.lease``: a class, not a generator context manager (once a request, on the
    way to the pool: a third of the cost)."""

    __slots__ = ("clock", "ev", "held", "replica", "sent", "sent_tokens", "tokens")

    def __init__(self, replica: Replica, tokens: int, ev: Event | None, clock: Clock | None):
        self.replica, self.tokens, self.ev, self.clock = replica, tokens, ev, clock
        self.held: Held | None = None

    def __enter__(self) -> None:
        r = self.replica
        r.outstanding += 1
        r.ahead_tokens += self.tokens
        r.sent_tokens += self.tokens
        r.sent += 1
        self.sent_tokens, self.sent = r.sent_tokens, r.sent
        ev = self.ev
        if ev is not None and self.clock is not None:
            self.held = r.occupancy.enter(ev.lane, ev.tenant, self.tokens, self.clock, ev)

    def __exit__(self, *exc: object) -> None:
        r = self.replica
        r.outstanding -= 1
        r.ahead_tokens -= self.tokens
        if self.ev is not None:
            self.ev.pool_prompt_tokens_during = r.sent_tokens - self.sent_tokens
            self.ev.pool_requests_during = r.sent - self.sent
        if self.held is not None:
            r.occupancy.leave(self.held)


class PoolSet:
    def __init__(self, config: Config, poll_interval_s: float = 5.0) -> None:
        self.config = config
        self.poll_interval_s = poll_interval_s
        tenants = tuple(config.tenants)
        self.replicas: dict[str, list[Replica]] = {
            p.name: [
                Replica(
                    p.name, u, p.engine, probe=None if p.metrics else p.health.path,
                    occupancy=Occupancy(tenants),
                )
                for u in p.replicas
            ]
            for p in config.pools
        }  # fmt: skip
        self._task: asyncio.Task[None] | None = None
        # Told the pool and the model names each replica's /metrics carries (the metrics'
        # model label).
        self.on_models: Callable[[str, tuple[str, ...]], None] | None = None
        # Told when a poll of a pool's replicas starts (False) and ends (True): admission by
        # saturation counts its requests in flight from each poll (obs.sidecar.policy.pool_gate).
        self.on_poll: Callable[[str, bool], None] | None = None
        self.settings = SettingsPoll(
            {p.name: p.declared.values() for p in config.pools if p.declared is not None}
        )

    def candidates(self, pool: str, affinity: str | None = None) -> list[Replica]:
        """Replicas to try in order: healthy ones by fewest outstanding requests, then the rest.

        With an ``affinity`` key (a prefix fingerprint) the first is the healthy replica that
        key hashes to (rendezvous hashing: a replica leaving moves only its own keys), unless
        that replica holds more than its bounded share of the outstanding requests
        (see ``AFFINITY_LOAD_FACTOR``): then the next replica in the key's order.
        """
        reps = self.replicas[pool]
        if len(reps) == 1:
            return reps
        healthy = sorted((r for r in reps if r.healthy), key=lambda r: r.outstanding)
        if affinity is not None and len(healthy) > 1:
            mean = (sum(r.outstanding for r in healthy) + 1) / len(healthy)
            cap = math.ceil(AFFINITY_LOAD_FACTOR * mean) + AFFINITY_LOAD_SLACK
            ranked = sorted(healthy, key=lambda r: _weight(affinity, r.url), reverse=True)
            first = next((r for r in ranked if r.outstanding < cap), healthy[0])
            healthy.remove(first)
            healthy.insert(0, first)
        return healthy + [r for r in reps if not r.healthy]

    def mark_failed(self, replica: Replica) -> None:
        if replica.healthy:
            log.warning("replica_unhealthy", pool=replica.pool, replica=replica.url)
        replica.healthy = False
        replica.failures += 1
        if replica.down_since is None:  # its cold start counts from the first failure
            replica.down_since, replica.back_since = time.time(), None

    def mark_ok(self, replica: Replica) -> None:
        if not replica.healthy:
            log.info("replica_healthy", pool=replica.pool, replica=replica.url)
        replica.healthy = True
        if replica.down_since is not None:
            took = time.time() - replica.down_since
            replica.cold_start_s[COLD_HEALTHY] = took
            replica.cold_starts += 1
            replica.back_since, replica.down_since = replica.down_since, None
            log.info("replica_cold_start", pool=replica.pool, replica=replica.url, healthy_s=took)

    def served_token(self, replica: Replica, at_s: float) -> None:
        """The replica served a token at Unix time ``at_s``: the first since it came back
        ends its cold start."""
        if replica.back_since is not None:
            replica.cold_start_s[COLD_FIRST_TOKEN] = max(0.0, at_s - replica.back_since)
            replica.back_since = None

    def cold_starts(self) -> dict[tuple[str, str], tuple[int, dict[str, float]]]:
        """Each replica that came back at least once: (times, last cold start per stage)."""
        return {
            (r.pool, r.url): (r.cold_starts, dict(r.cold_start_s))
            for reps in self.replicas.values()
            for r in reps
            if r.cold_starts
        }

    def occupancies(self) -> list[tuple[str, str, Occupancy]]:
        """(pool, url, who holds it) of every replica: the occupancy gauges."""
        return [(r.pool, r.url, r.occupancy) for reps in self.replicas.values() for r in reps]

    def snapshot(self) -> dict[tuple[str, str], EngineState | None]:
        return {
            (r.pool, r.url): (r.state if r.healthy else None)
            for reps in self.replicas.values()
            for r in reps
        }

    def saturation_view(self, pool: str) -> tuple[list[ReplicaView], float | None]:
        """The pool's replicas as last read (for admission by saturation), and the age in
        seconds of the oldest read among the healthy ones (None: one was never read)."""
        now = time.monotonic()
        views, age = [], 0.0
        for r in self.replicas[pool]:
            s = r.state if r.healthy else None
            views.append(
                ReplicaView(
                    s is not None,
                    None if s is None else s.waiting,
                    None if s is None else s.running,
                    None if s is None else s.kv_cache_usage,
                )
            )
            if s is not None:
                age = max(age, now - r.read_at) if r.read_at is not None else float("inf")
        return views, (None if age == float("inf") else age)

    def default_model(self, pool: str) -> str | None:
        """The model a request naming none is served: the pool's configured ``model``, else
        the one model its replicas' /metrics name (None when they name several or none)."""
        configured = self.config.pool(pool).model if pool in self.replicas else None
        if configured:
            return configured
        seen = {m for r in self.replicas.get(pool, ()) if r.state for m in r.state.models}
        return seen.pop() if len(seen) == 1 else None

    def engine(self, pool: str, url: str) -> str | None:
        """The engine a replica runs: configured, or as its last /metrics page showed."""
        for r in self.replicas.get(pool, ()):
            if r.url == url:
                if r.engine != AUTO:
                    return r.engine
                return None if r.state is None else r.state.engine
        return None

    def served(self) -> dict[tuple[str, str], Served]:
        """What each answering replica runs (replicas down or not yet read left out)."""
        return {
            (r.pool, r.url): r.served
            for reps in self.replicas.values()
            for r in reps
            if r.healthy and r.state is not None and r.served is not None
        }

    def health(self) -> dict[str, dict[str, bool]]:
        return {pool: {r.url: r.healthy for r in reps} for pool, reps in self.replicas.items()}

    async def poll_once(self, session: aiohttp.ClientSession) -> None:
        limit = min(2.0, self.poll_interval_s)
        timeout = aiohttp.ClientTimeout(total=limit, sock_connect=limit)
        reps = [r for rs in self.replicas.values() for r in rs]
        self._polled(False)
        await asyncio.gather(*(self._poll(session, r, timeout) for r in reps))
        self._polled(True)

    def _polled(self, done: bool) -> None:
        if self.on_poll is not None:
            for pool in self.replicas:
                self.on_poll(pool, done)

    async def _poll(
        self, session: aiohttp.ClientSession, r: Replica, limit: aiohttp.ClientTimeout
    ) -> None:
        try:
            async with session.get(f"{r.url}{r.probe or '/metrics'}", timeout=limit) as resp:
                if r.probe is not None and resp.status < 500:
                    # Answered: a hosted API says 401 without the key, and is up all the same.
                    self._probe_ok(r)
                    return
                if resp.status != 200:
                    raise aiohttp.ClientResponseError(
                        resp.request_info, (), status=resp.status, message="bad status"
                    )
                text = await resp.text()
        except TimeoutError as e:
            connected = not isinstance(e, aiohttp.ConnectionTimeoutError)
            if connected and r.healthy and r.slow_polls < SLOW_POLLS_TOLERATED:
                r.slow_polls += 1
                log.info("replica_metrics_slow", pool=r.pool, replica=r.url, late=r.slow_polls)
                return
            self._poll_failed(r)
            return
        except (aiohttp.ClientError, OSError):
            self._poll_failed(r)
            return
        r.slow_polls = 0
        r.read_at = time.monotonic()
        before = r.state.preemptions if r.state is not None else None
        try:
            r.state = read_state(r.engine, text)
        except ExpositionError as e:
            # The replica answers, so it is up; what its engine reports is unknown.
            log.warning("replica_metrics_unreadable", pool=r.pool, replica=r.url, error=str(e))
            r.state = unknown_state()
        now = r.state.preemptions
        r.preempting = before is not None and now is not None and now > before
        if r.state.models and self.on_models is not None:
            self.on_models(r.pool, r.state.models)
        await self.settings.read(session, r, text, limit)
        self.mark_ok(r)

    def _probe_ok(self, r: Replica) -> None:
        """A pool without /metrics answered its probe: up, with no engine state to read."""
        r.slow_polls = 0
        r.state = unknown_state()
        self.mark_ok(r)

    def _poll_failed(self, r: Replica) -> None:
        r.slow_polls = 0
        r.state = None
        self.settings.went_down(r)
        self.mark_failed(r)

    def start(self, session: aiohttp.ClientSession) -> None:
        async def loop() -> None:
            while True:
                await self.poll_once(session)
                await asyncio.sleep(self.poll_interval_s)

        self._task = asyncio.get_running_loop().create_task(loop(), name="vllm-obs-pool-monitor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
