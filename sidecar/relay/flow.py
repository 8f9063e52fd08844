"""Flow control on the request path (docs/flow.md): a request is charged to its tenant's
and API key's rate limits before its lane's gate, and after the lane's gate it waits for
room in its pool when the pool admits by saturation.

``FlowControl.charge`` raises the rate limit's 429 (``admission_gate: rate_limit``);
``admit_pool`` waits in the pool's one queue or raises its 429 (``pool:GATE``, the bound
that held it): the gates decide (a ``Refusal``), raised to the relay, which answers it;
``settle`` corrects the token charge by what the request used, once it finished. A request
sent to its lane's fallback pool is not gated again there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial

from prometheus_client import CollectorRegistry

from obs.config import Config
from obs.exporters.flow import FlowCollector
from obs.sidecar.outcomes import Refusal, Refused, Rejected
from obs.sidecar.policy.admission import Ticket
from obs.sidecar.policy.pool_gate import Hold, PoolGate
from obs.sidecar.policy.rate_limit import TOKENS
from obs.sidecar.pools.pools import PoolSet
from obs.sidecar.relay.payloads import charged_output
from obs.sidecar.relay.rate_store import RateLimiter
from obs.sidecar.relay.request import Plan, Request

RATE_LIMIT_GATE = "rate_limit"
LANE_GATE = "lane"


async def admit_lane(req: Request, plan: Plan, ticket: Ticket) -> bool:
    """The lane's gate (False: the client left while queued); the event names it when it
    queued or refused the request."""
    admitted = await plan.gate.admit(ticket)
    if ticket.queued_at or isinstance(admitted, Refusal):
        req.event.admission_gate = LANE_GATE
    if isinstance(admitted, Refusal):
        raise Refused(admitted)
    return admitted


class FlowControl:
    """The rate limiter and each saturated pool's gate, as the relay uses them."""

    def __init__(
        self, config: Config, limiter: RateLimiter, pool_gates: dict[str, PoolGate]
    ) -> None:
        self.limiter = limiter
        self.pool_gates = pool_gates
        default = config.rate_limits.default
        self.needs_prompt_tokens = (
            any(t.tokens_per_minute for t in config.tenants.values())
            or any(k.tokens_per_minute for k in config.auth.api_keys)
            or bool(default and default.tokens_per_minute)
        )
        self._settling: set[asyncio.Task[None]] = set()

    @classmethod
    def build(
        cls,
        config: Config,
        pools: PoolSet,
        registry: CollectorRegistry,
        store_failed: Callable[[], None],
    ) -> FlowControl:
        """The limiter and each saturated pool's gate, told of each poll of the pool set;
        their state on ``registry`` (exporters/flow.py)."""
        gates = {
            p.name: PoolGate(
                config, p, partial(pools.saturation_view, p.name), pools.poll_interval_s
            )
            for p in config.pools
            if p.saturation is not None
        }
        if gates:
            pools.on_poll = lambda pool, done: gates[pool].on_poll(done) if pool in gates else None
        registry.register(FlowCollector(config, gates))
        return cls(config, RateLimiter(config, store_failed=store_failed), gates)

    async def charge(self, req: Request, plan: Plan, key_hash: str | None) -> None:
        """Charge the request to its rate limits, or raise their 429 (or 503, failing closed)."""
        if not self.limiter.enabled:
            return
        ev = req.event
        try:
            max_tokens = charged_output(ev.route, ev.max_tokens)  # None: no cap (payloads)
            prompt = max(0, plan.cost - (ev.max_tokens or 0))  # the lane gate's estimate
            req.charge = await self.limiter.charge(
                ev.tenant, key_hash, prompt, max_tokens, req.share_key
            )
        except Rejected:
            ev.admission_gate = RATE_LIMIT_GATE
            raise

    async def admit_pool(self, req: Request, plan: Plan) -> bool:
        """Wait for room in the request's pool when it admits by saturation (False: the
        client left while queued); raises the pool queue's 429."""
        ev = req.event
        gate = self.pool_gates.get(ev.pool or plan.lane.pool)
        if gate is None:
            return True
        hold = req.pool_hold = Hold()
        req.pool_gate = gate
        try:
            admitted = await gate.admit(
                plan.lane.name,
                req.share_key or ev.tenant,
                ev.priority or 0,
                plan.lane.admission.queue_timeout_s,
                hold,
            )
        finally:
            if hold.gate is not None:
                ev.admission_gate = f"pool:{hold.gate}"
        if isinstance(admitted, Refusal):
            raise Refused(admitted)
        req.pool_admitted = admitted
        return admitted

    def withdraw(self, req: Request) -> None:
        """The client left: stop waiting in the pool's queue."""
        if req.pool_gate is not None and req.pool_hold is not None and not req.pool_admitted:
            req.pool_gate.withdraw(req.pool_hold)

    def settle(self, req: Request) -> None:
        """Correct the request's token charge to what it used (its usage, 0 when it never
        reached the pool); a request whose tokens are unknown keeps its charge."""
        charge, ev = req.charge, req.event
        if charge is None or not any(lim.kind == TOKENS for lim in charge.limits):
            return
        if ev.prompt_tokens is not None or ev.completion_tokens is not None:
            used = (ev.prompt_tokens or 0) + (ev.completion_tokens or 0)
        elif not ev.replica:
            used = 0  # refused before any replica was tried: nothing was used
        else:
            return
        settle = self.limiter.settle(charge, used, ev.prompt_tokens or 0)
        task = asyncio.get_running_loop().create_task(settle)
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def close(self) -> None:
        if self._settling:
            await asyncio.wait(self._settling, timeout=2)
        await self.limiter.close()
