"""The order in which the two xdist workers take the suite's units (tests/support/workers.py)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tests.support.workers import CostliestFirst, read_costs


def _drain(queue: CostliestFirst) -> list[str]:
    return [queue.popitem(last=False)[0] for _ in range(len(queue))]


def test_costliest_unit_is_taken_first_and_units_that_end_an_engine_last() -> None:
    """A free worker takes the costliest unit left; ``ends:`` units come after all others in
    the order they were queued, whatever their cost."""
    cost = {"a.py": 5.0, "b.py": 90.0, "shared:llama": 40.0, "ends:vllm": 500.0, "ends:x": 1.0}
    queue = CostliestFirst(cost)
    for scope in ["a.py", "ends:x", "b.py", "ends:vllm", "shared:llama", "c.py"]:
        queue[scope] = {}
    assert _drain(queue) == ["b.py", "shared:llama", "a.py", "c.py", "ends:x", "ends:vllm"]


@given(st.dictionaries(st.text(min_size=1), st.floats(0, 1e4), max_size=20))
def test_every_queued_unit_is_taken_once(cost: dict[str, float]) -> None:
    """Whatever the costs, each queued unit is handed out exactly once."""
    queue = CostliestFirst(cost)
    for scope in cost:
        queue[scope] = {scope: False}
    assert sorted(_drain(queue)) == sorted(cost)


def test_measured_seconds_add_up_by_unit(tmp_path: Path) -> None:
    """A measure file's phases add up per unit; comments and a missing file are nothing."""
    f = tmp_path / "m.tsv"
    f.write_text("# head\nshared:llama\t1.5\na.py\t2\nshared:llama\t3\n", encoding="utf-8")
    assert read_costs(f) == {"shared:llama": 4.5, "a.py": 2.0}
    assert read_costs(tmp_path / "none.tsv") == {}
