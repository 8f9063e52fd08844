"""The calibration's closed-loop replay (bench/sim_calibration_replay.py): a source's own
prompt list and warm-up replayed, so its repeated prompts meet the simulated prefix cache."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

from bench import sim_calibration as cal
from bench.sim_calibration_points import HELD_OUT, IB_LONG_IN, IB_SHORT_IN
from bench.sim_calibration_replay import (
    BLOCK_TOKENS,
    IB_LONG,
    IB_SHORT,
    IB_WARMUP_ROUNDS,
    PromptSet,
)


def test_a_prompt_sets_blocks_match_exactly_where_its_prompts_do() -> None:
    """A repeated prompt has the same block hashes; two different prompts share only the
    full blocks of their common head; a prompt has one hash per full block."""
    first = IB_LONG.order[0]
    again = IB_LONG.order.index(first, 1)
    assert IB_LONG.request("a", 0, 1).block_hashes == IB_LONG.request("b", again, 1).block_hashes
    a, b = IB_LONG.block_hashes(0), IB_LONG.block_hashes(1)
    shared = IB_LONG.head // BLOCK_TOKENS
    assert shared >= 1 and a[:shared] == b[:shared] and set(a[shared:]).isdisjoint(b[shared:])
    assert len(a) == IB_LONG.lengths[0] // BLOCK_TOKENS


def test_the_sources_prompt_lists_average_round_5s_token_estimates() -> None:
    """inference-bench's prompt lists (10 distinct long prompts and 49 short ones, 100 sends
    each) average the prompt lengths round 5 registered (same rule: 4 characters a token)."""
    assert (len(IB_LONG.lengths), len(IB_SHORT.lengths)) == (10, 49)
    assert len(IB_LONG.order) == len(IB_SHORT.order) == 100
    long = statistics.mean(IB_LONG.lengths[k] for k in IB_LONG.order)
    short = statistics.mean(IB_SHORT.lengths[k] for k in IB_SHORT.order)
    assert round(long) == IB_LONG_IN and round(short) == IB_SHORT_IN


def test_a_warmed_up_replay_of_repeated_long_prompts_hits_the_prefix_cache() -> None:
    """The L4 long run at concurrency 16 replayed with the source's prompts and warm-up has
    a far lower TTFT than with random prompts (the real server's prefix-cache hits), lower
    still after the warm-up, whose requests are outside the measured span."""
    run = next(c for c in HELD_OUT if c.name == "ib-l4-qwen2.5-7b-long-c16")
    cold = cal.simulate(run)
    listed = cal.simulate(replace(run, prompt_set=IB_LONG))
    warm = cal.simulate(replace(run, prompt_set=IB_LONG, warmup_rounds=IB_WARMUP_ROUNDS))
    assert warm["ttft_p50_ms"] < listed["ttft_p50_ms"] < cold["ttft_p50_ms"] / 3
    assert warm["latency_ms"] < listed["latency_ms"]


def test_a_prompt_set_that_cannot_be_replayed_is_refused_clearly() -> None:
    """An order naming no listed prompt, an empty prompt, or a run longer than the list is
    a ValueError that says why."""
    with pytest.raises(ValueError, match="order"):
        PromptSet((10,), (0, 1))
    with pytest.raises(ValueError, match="at least one token"):
        PromptSet((0,), (0,))
    with pytest.raises(ValueError, match="has 1 prompts"):
        PromptSet((10,), (0,)).request("r", 1, 4)
