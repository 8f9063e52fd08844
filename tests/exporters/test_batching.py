"""The event writers' batching rule (``batching.to_write``): full batches on a count wake-up."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from obs.exporters.batching import to_write


def test_a_count_wake_up_writes_only_while_a_full_batch_waits() -> None:
    """Woken by the count: 85 of 120 now, then nothing until the interval or a flush."""
    assert to_write(120, 85, 85, everything=False) == 85
    assert to_write(35, 85, 85, everything=False) == 0
    assert to_write(35, 85, 85, everything=True) == 35


def test_the_interval_or_a_flush_writes_everything_in_batches() -> None:
    """Everything asked: batches of at most ``batch_items`` until none waits."""
    assert to_write(9000, 1024, 4096, everything=True) == 4096
    assert to_write(0, 1024, 4096, everything=True) == 0


@given(
    waiting=st.integers(0, 10_000),
    wake=st.integers(1, 5000),
    batch=st.integers(1, 5000),
    everything=st.booleans(),
)
def test_draining_by_the_rule_leaves_less_than_a_wake_up(
    waiting: int, wake: int, batch: int, everything: bool
) -> None:
    """Writing until the rule says 0 leaves nothing (everything asked) or fewer than wake_items,
    and no write is empty or over a batch."""
    left = waiting
    while n := to_write(left, wake, batch, everything):
        assert 0 < n <= min(batch, left)
        left -= n
    assert left == 0 if everything else left < wake
