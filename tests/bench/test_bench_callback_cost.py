"""bench/callback_cost.py: both hand-overs of a pool read run the sink once per read."""

from __future__ import annotations

import uvloop

from bench import callback_cost


def test_both_shapes_hand_every_read_to_the_sink_once() -> None:
    """Each shape runs the sink exactly once per read and reports a CPU figure per run."""
    for shape in (callback_cost.callback, callback_cost.awaitable):
        sink = callback_cost.Sink()
        uvloop.run(shape(1000, sink))
        assert sink.reads == 1000
    result = uvloop.run(callback_cost.measure(100, 2))
    assert sorted(result) == ["awaitable", "callback"]
    assert all(len(v) == 2 and all(u >= 0 for u in v) for v in result.values())
