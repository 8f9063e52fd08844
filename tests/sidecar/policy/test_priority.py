"""Priority within a lane: obs.sidecar.policy.priority's pure policy (resolve, aging, pick,
displace), with hypothesis, and the lane gate admitting by it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from obs import conventions as c
from obs.config import Lane, Priority
from obs.lanes import RequestAttrs
from obs.sidecar.outcomes import Refusal
from obs.sidecar.policy import priority as pr
from obs.sidecar.policy.admission import LaneGate, Ticket


@dataclass
class Q:
    priority: int
    queued_at: float


def _attrs(tenant: str | None = None, stream: bool = False) -> RequestAttrs:
    return RequestAttrs("/v1/chat/completions", "m", stream, {}, tenant, 8, None)


POLICY = Priority.model_validate(
    {
        "header": "x-priority",
        "tenants": {"gold": 7},
        "rules": [{"match": {"stream": True}, "priority": 4}],
        "default": 1,
    }
)


@pytest.mark.parametrize(
    ("headers", "tenant", "stream", "want"),
    [
        ({"x-priority": "9"}, None, True, 9),  # the header first
        ({"x-priority": "9"}, "gold", True, 7),  # never above the tenant's level
        ({"x-priority": "3"}, "gold", True, 3),  # below it: the header's
        ({"x-priority": "\u00b9"}, None, False, 1),  # a superscript one is not a digit
        ({"x-priority": "\u0663"}, None, True, 4),  # nor an Arabic-Indic three
        ({"x-priority": "high"}, "gold", True, 7),  # not a digit: the tenant's
        ({"x-priority": "12"}, None, True, 4),  # out of range: the rule's
        ({}, "bronze", False, 1),  # nothing: the default
    ],
)
def test_resolve_takes_header_then_tenant_then_rule_then_default(
    headers: dict[str, str], tenant: str | None, stream: bool, want: int
) -> None:
    """The first source that gives a priority wins; a bad header value is ignored; the header
    never lifts a tenant's request above its tenant's level."""
    assert pr.resolve(POLICY, headers, _attrs(tenant, stream)) == want


@given(st.text(max_size=4))
def test_any_header_value_resolves_to_a_priority(raw: str) -> None:
    """Whatever the header holds (any Unicode), resolve gives 0-9 and never raises."""
    assert 0 <= pr.resolve(POLICY, {"x-priority": raw}, _attrs()) <= 9


def test_the_priority_header_is_off_unless_named() -> None:
    """A policy without ``header`` ignores X-Priority: clients cannot pick their own level."""
    policy = Priority.model_validate({"tenants": {"gold": 7}, "default": 1})
    assert policy.header is None
    assert pr.resolve(policy, {"x-priority": "9"}, _attrs()) == 1


tickets = st.lists(
    st.builds(Q, st.integers(0, 9), st.floats(0, 100, allow_nan=False)), min_size=1, max_size=12
)


@given(tickets, st.floats(0.1, 10))
def test_pick_admits_the_highest_aged_priority_oldest_first(queue: list[Q], aging: float) -> None:
    """pick() returns a ticket no other outranks after aging; among equals, the first queued."""
    now = 100.0
    got = pr.pick(queue, now, aging)
    rank = pr.effective(got, now, aging)
    assert all(pr.effective(t, now, aging) <= rank for t in queue)
    first_equal = next(t for t in queue if pr.effective(t, now, aging) == rank)
    assert got is first_equal


@given(st.integers(0, 9), st.floats(0.1, 10), st.floats(0, 50))
def test_aging_bounds_the_wait_of_the_lowest_priority(p: int, aging: float, extra: float) -> None:
    """A request waiting (9 - p) * aging_s is admitted before any request arriving later, of
    any priority: starvation is bounded."""
    old = Q(p, 0.0)
    waited = (9 - p) * aging + extra + 1e-6
    newcomers = [Q(9, waited - 1e-9 * i) for i in range(3)]
    assert pr.pick([*newcomers, old], waited, aging) is old


@given(tickets, st.integers(0, 9), st.floats(0.1, 10))
def test_displaced_gives_up_only_a_lower_ranked_ticket(
    queue: list[Q], p: int, aging: float
) -> None:
    """displaced() names the lowest-ranked ticket below the newcomer, else None."""
    now = 100.0
    got = pr.displaced(queue, p, now, aging)
    lowest = min(pr.effective(t, now, aging) for t in queue)
    if lowest >= p:
        assert got is None
    else:
        assert got is not None and pr.effective(got, now, aging) == lowest


def _lane(**admission: Any) -> Lane:
    spec = {"name": "l", "pool": "p", "admission": admission, "priority": {"aging_s": 60}}
    return Lane.model_validate(spec)


def test_the_gate_admits_higher_priorities_first_and_displaces_the_lowest() -> None:
    """Under pressure: a freed slot goes to the highest priority waiting, and a full queue
    refuses its lowest priority (429 lower_priority) for a higher newcomer, never an equal."""

    async def scenario() -> None:
        gate = LaneGate(_lane(max_concurrency=1, max_queue=2, queue_timeout_s=30))
        holder = Ticket("t", 0)
        assert await gate.admit(holder) is True
        low = asyncio.ensure_future(gate.admit(Ticket("t", 0, priority=1)))
        mid = asyncio.ensure_future(gate.admit(Ticket("t", 0, priority=5)))
        await asyncio.sleep(0)
        equal = await gate.admit(Ticket("t", 0, priority=1))  # ranks with low: no displacing
        assert isinstance(equal, Refusal) and equal.reason == c.QUEUE_FULL
        high = asyncio.ensure_future(gate.admit(Ticket("t", 0, priority=8)))
        await asyncio.sleep(0)
        displaced = await low
        assert isinstance(displaced, Refusal)
        assert (displaced.reason, displaced.status) == (c.LOWER_PRIORITY, 429)
        gate.release(holder)
        assert await high is True and not mid.done()
        assert gate.in_flight == 1 and gate.queued == 1
        mid.cancel()

    asyncio.run(scenario())


def test_a_priority_rule_on_prompt_size_makes_the_lane_estimate_it() -> None:
    """A rule on prompt tokens needs the estimate (the relay computes it only when asked)."""
    plain = LaneGate(_lane())
    spec = {"name": "l", "pool": "p", "priority": {"rules": [
        {"match": {"max_prompt_tokens": 100}, "priority": 9}]}}  # fmt: skip
    sized = LaneGate(Lane.model_validate(spec))
    assert not plain.needs_prompt_tokens and sized.needs_prompt_tokens
    assert sized.priority is not None
    short = RequestAttrs("/v1/chat/completions", "m", False, {}, None, 8, 50)
    assert pr.resolve(sized.priority, {}, short) == 9
