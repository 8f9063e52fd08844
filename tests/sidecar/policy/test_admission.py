"""obs.sidecar.policy.admission, directly: the lane gate's limits, queue order and refusals."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from obs import conventions as c
from obs.config import Lane
from obs.sidecar.outcomes import ADMISSION, Refusal
from obs.sidecar.policy.admission import LaneGate, Ticket, cost_of


def _lane(**admission: Any) -> Lane:
    return Lane.model_validate({"name": "l", "pool": "p", "admission": admission})


@given(
    st.one_of(st.none(), st.integers(1, 1000)),
    st.one_of(st.none(), st.integers(1, 2000)),
    st.one_of(st.none(), st.integers(0, 1500)),
    st.one_of(st.none(), st.integers(0, 1500)),
)
def test_check_refuses_exactly_what_can_never_be_admitted(
    max_prompt: int | None, budget: int | None, pt: int | None, mt: int | None
) -> None:
    """check(): 413 prompt_too_long over max_prompt_tokens, else over_token_budget over the
    whole budget, else no refusal (the cost: prompt + max_tokens)."""
    gate = LaneGate(_lane(max_prompt_tokens=max_prompt, token_budget=budget))
    cost = (pt or 0) + (mt or 0)
    r = gate.check(pt, mt)
    if r is not None:
        assert (r.status, r.by) == (413, ADMISSION)
        if max_prompt is not None and (pt or 0) > max_prompt:
            assert r.reason == c.PROMPT_TOO_LONG
        else:
            assert r.reason == c.OVER_TOKEN_BUDGET and budget is not None and cost > budget
        return
    assert cost_of(pt, mt) == cost
    assert max_prompt is None or (pt or 0) <= max_prompt
    assert budget is None or cost <= budget


def test_full_queue_and_fair_share_refuse_with_429_and_retry_after() -> None:
    """A full lane refuses the tenant over its share, then anyone once the queue is full."""

    async def scenario() -> None:
        gate = LaneGate(_lane(max_concurrency=2, max_queue=1, tenant_fair_share=True))
        assert await gate.admit(Ticket("t1", 0)) is True
        assert await gate.admit(Ticket("t2", 0)) is True
        share = await gate.admit(Ticket("t1", 0))  # 2 tenants over 2 slots: t1 holds its 1
        assert isinstance(share, Refusal)
        assert (share.reason, share.status, share.retry_after) == (c.TENANT_SHARE, 429, 1)
        waiting = asyncio.ensure_future(gate.admit(Ticket("t3", 0)))
        await asyncio.sleep(0)
        full = await gate.admit(Ticket("t4", 0))
        assert isinstance(full, Refusal) and full.reason == c.QUEUE_FULL
        waiting.cancel()

    asyncio.run(scenario())


def test_queue_timeout_refuses_and_leaves_no_trace() -> None:
    """No slot within queue_timeout_s: 429 queue_timeout, and the queue is empty again."""

    async def scenario() -> None:
        gate = LaneGate(_lane(max_concurrency=1, max_queue=4, queue_timeout_s=0.05))
        assert await gate.admit(Ticket("t", 0)) is True
        r = await gate.admit(Ticket("t", 0))
        assert isinstance(r, Refusal) and (r.reason, r.retry_after) == (c.QUEUE_TIMEOUT, 1)
        assert gate.queued == 0 and gate.by_tenant == {"t": 1}

    asyncio.run(scenario())


# One step of a workload: a request arrives (tenant, tokens) or the oldest running one ends.
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.sampled_from(["t1", "t2", "t3"]), st.integers(0, 60)),
        st.tuples(st.just("finish"), st.just(""), st.just(0)),
    ),
    max_size=40,
)


@settings(deadline=None)
@given(
    _steps,
    st.one_of(st.none(), st.integers(1, 4)),
    st.one_of(st.none(), st.integers(60, 150)),
    st.integers(0, 6),
    st.booleans(),
)
def test_gate_never_exceeds_its_limits_and_serves_the_queue_in_order(
    steps: list[tuple[str, str, int]],
    max_concurrency: int | None,
    budget: int | None,
    max_queue: int,
    fair: bool,
) -> None:
    """Under any arrival/finish order: in-flight count, tokens and queue stay within limits,
    the bookkeeping matches what is really running, and (without fair share) queued
    requests are admitted oldest first."""
    lane = _lane(
        max_concurrency=max_concurrency,
        token_budget=budget,
        max_queue=max_queue,
        queue_timeout_s=60,
        tenant_fair_share=fair,
    )

    async def scenario() -> None:
        gate = LaneGate(lane)
        running: list[Ticket] = []
        queued: list[tuple[Ticket, asyncio.Future[bool | Refusal]]] = []
        admitted_from_queue: list[Ticket] = []

        arrival: dict[int, int] = {}

        def settle() -> None:
            for t, fut in list(queued):
                if t.waiter is not None and t.waiter.done() and t.waiter.result():
                    queued.remove((t, fut))  # admitted: _wake took its slot
                    running.append(t)
                    admitted_from_queue.append(t)

        for kind, tenant, tokens in steps:
            if kind == "arrive":
                ticket = Ticket(tenant, tokens)
                arrival[id(ticket)] = len(arrival)
                fut = asyncio.ensure_future(gate.admit(ticket))
                await asyncio.sleep(0)
                if fut.done():
                    if fut.result() is True:
                        running.append(ticket)
                    else:
                        assert isinstance(fut.result(), Refusal)
                else:
                    queued.append((ticket, fut))
            elif running:
                gate.release(running.pop(0))
                await asyncio.sleep(0)
            settle()
            assert gate.in_flight == len(running)
            assert gate.tokens == sum(t.tokens for t in running)
            assert gate.queued == len(queued) <= max_queue
            if max_concurrency is not None:
                assert gate.in_flight <= max_concurrency
            if budget is not None and gate.in_flight > 1:
                assert gate.tokens <= budget  # one request alone may exceed it
        if not fair:
            order = [arrival[id(t)] for t in admitted_from_queue]
            assert order == sorted(order)
        for _, pending in queued:
            pending.cancel()
        await asyncio.gather(*(f for _, f in queued), return_exceptions=True)

    asyncio.run(scenario())
