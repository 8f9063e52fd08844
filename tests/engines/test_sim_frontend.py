"""The simulated API server's CPU (obs.engines.sim.frontend): its event loop's queue and its
tokeniser thread's, each in arrival order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from obs.engines.sim.frontend import FrontEnd, FrontEndCost

COST = FrontEndCost(prompt_token_s=1e-5, token_s=1e-4)


def test_requests_taken_in_together_queue_one_behind_another() -> None:
    """Two 1000-token prompts arriving at once: the second reaches the engine after both."""
    fe = FrontEnd(COST)
    assert fe.intake(1.0, 1000) == pytest.approx(1.01)
    assert fe.intake(1.0, 1000) == pytest.approx(1.02)
    assert fe.intake(5.0, 1000) == pytest.approx(5.01)  # idle again: no wait


def test_each_steps_tokens_are_out_after_its_own_work_when_the_front_end_keeps_up() -> None:
    """Ten tokens a step (1 ms of work) after 20 ms steps: each step's tokens are out 1 ms
    after it ends, and the front end was busy for the work alone."""
    fe = FrontEnd(COST)
    assert fe.stream(0.0, 0.02, 5, 10) == pytest.approx(0.1 + 0.001)
    assert fe.busy_s == pytest.approx(0.005)


def test_a_front_end_slower_than_the_steps_falls_behind() -> None:
    """300 tokens a step (30 ms of work) after 20 ms steps: the backlog grows every step."""
    fe = FrontEnd(COST)
    assert fe.stream(0.0, 0.02, 4, 300) == pytest.approx(0.02 + 4 * 0.03)


@settings(max_examples=200, deadline=None)
@given(
    backlog=st.floats(0, 1),
    step_s=st.floats(1e-3, 0.1),
    steps=st.integers(1, 50),
    tokens=st.integers(0, 1000),
)
def test_a_run_of_steps_at_once_matches_step_by_step(
    backlog: float, step_s: float, steps: int, tokens: int
) -> None:
    """Handing over a run of identical steps at once ends where handing them over one by
    one (each step's tokens queued behind whatever is left) ends."""
    run = FrontEnd(COST)
    run.free_at = backlog
    one = FrontEnd(COST)
    one.free_at = backlog
    for i in range(steps):
        one.stream(i * step_s, step_s, 1, tokens)
    assert run.stream(0.0, step_s, steps, tokens) == pytest.approx(one.free_at)
    assert run.busy_s == pytest.approx(one.busy_s)


def test_a_request_costs_its_set_up_in_the_queue_and_its_latency_outside_it() -> None:
    """``request_s`` queues requests behind each other's set-up; ``fixed_s`` delays each
    request's hand-over without holding the queue; the split keeps PR #15137's budget."""
    cost = FrontEndCost(prompt_token_s=0.0, token_s=1e-4, request_s=0.003, fixed_s=0.01)
    fe = FrontEnd(cost)
    assert fe.intake(1.0, 100) == pytest.approx(1.013)
    assert fe.intake(1.0, 100) == pytest.approx(1.016)  # behind the first's 3 ms, not its 10
    split = FrontEndCost.split(0.003, 0.012)
    per_request = split.request_s + split.render_s
    assert 73.65 * per_request + 14791 * split.token_s == pytest.approx(1.0)
    assert split.fixed_s == 0.012 and split.token_s < FrontEndCost().token_s


def test_prompts_are_tokenised_beside_the_loop_not_on_it() -> None:
    """A burst of long prompts queues on the tokeniser thread, not on the event loop: the
    loop is free after each request's own set-up, so a step's tokens are streamed while
    the prompts are still being tokenised."""
    cost = FrontEndCost(prompt_token_s=1e-5, token_s=1e-4, request_s=0.001, render_s=0.0)
    fe = FrontEnd(cost)
    ready = [fe.intake(0.0, 1000) for _ in range(3)]
    assert ready == pytest.approx([0.011, 0.021, 0.031])  # 10 ms of tokens each, in turn
    assert fe.free_at == pytest.approx(0.003)  # the loop: three set-ups
    assert fe.stream(0.0, 0.005, 1, 10) == pytest.approx(0.006)  # not behind the prompts
