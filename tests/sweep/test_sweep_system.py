"""The matrix's whole-system verdict (obs.sweep.matrix): sums over lanes and the best profile."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from obs.sweep.matrix import best_system, system_rows


def _row(profile: str, lane: str, requests: int, good: int, rejected: int) -> dict[str, Any]:
    return {
        "profile": profile,
        "lane": lane,
        "requests": requests,
        "good": good,
        "rejected": rejected,
    }


def test_system_rows_add_lanes_up_per_profile() -> None:
    """Offered, accepted and good are the sums over a profile's lanes; shares are of offered."""
    rows = [
        _row("a", "chat", 100, 90, 5),
        _row("a", "batch", 100, 10, 50),
        _row("b", "chat", 50, 50, 0),
    ]
    a, b = system_rows(rows, {"a": 10.0, "b": 0.0})
    assert (a["offered"], a["accepted"], a["good"]) == (200, 145, 100)
    assert a["accepted_share"] == 145 / 200 and a["goodput_share"] == 0.5
    assert a["goodput_rps"] == 10.0 and b["goodput_rps"] is None


def test_best_overall_is_tested_against_the_runner_up() -> None:
    """A clear winner on thousands of requests is significant; equal shares are a tie."""
    system = system_rows(
        [_row("a", "x", 5000, 4900, 0), _row("b", "x", 5000, 2500, 0)], {"a": 1.0, "b": 1.0}
    )
    best = best_system(system, 0.01)
    assert best is not None and best["best"] == "a" and best["runner_up"] == "b"
    assert best["significant"] is True
    tie = best_system(
        system_rows([_row("a", "x", 10, 5, 0), _row("b", "x", 10, 5, 0)], {"a": 1.0, "b": 1.0}),
        0.01,
    )
    assert tie is not None and tie["significant"] is False


@given(
    st.lists(
        st.tuples(
            st.sampled_from("pqr"), st.integers(0, 500), st.integers(0, 500), st.integers(0, 500)
        ),
        min_size=1,
        max_size=12,
    )
)
def test_best_overall_has_the_highest_goodput_share(parts: list[tuple[str, int, int, int]]) -> None:
    """Whatever the lanes, the best profile's share of good offered requests is the highest."""
    rows = []
    for i, (profile, n, good, rejected) in enumerate(parts):
        good, rejected = min(good, n), min(rejected, n - min(good, n))
        rows.append(_row(profile, f"l{i}", n, good, rejected))
    system = system_rows(rows, dict.fromkeys("pqr", 1.0))
    best = best_system(system, 0.01)
    offered = [r for r in system if r["offered"]]
    if not offered:
        assert best is None
        return
    assert best is not None
    assert best["best_share"] == max(r["goodput_share"] for r in offered)
