"""The relay benchmark's order of targets per round (``bench.report.round_order``): every
target runs each round once, and every two targets swap places within every two rounds, so
no target is always measured just after another."""

from __future__ import annotations

from itertools import combinations

from hypothesis import given
from hypothesis import strategies as st

from bench.report import round_order

NAMES = ["direct", "sidecar", "before", "vllm-router"]


def test_two_rounds_run_one_order_then_its_reverse() -> None:
    """Rounds 1 and 2: the given order, then reversed; round 3 starts one target later."""
    assert round_order(NAMES, 1) == NAMES
    assert round_order(NAMES, 2) == NAMES[::-1]
    assert round_order(NAMES, 3) == ["sidecar", "before", "vllm-router", "direct"]


@given(st.integers(2, 6), st.integers(1, 12))
def test_each_round_is_every_target_once_and_each_pair_swaps_every_two_rounds(
    n: int, pairs: int
) -> None:
    """Over any even number of rounds, each pair of targets runs in each order equally often
    (a plain rotation ran ``sidecar`` before ``before`` in both of two rounds)."""
    names = [f"t{i}" for i in range(n)]
    orders = [round_order(names, r) for r in range(1, 2 * pairs + 1)]
    assert all(sorted(o) == sorted(names) for o in orders)
    for a, b in combinations(names, 2):
        first = sum(o.index(a) < o.index(b) for o in orders)
        assert first == pairs
