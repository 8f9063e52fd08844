"""The load plan: seeded Poisson and closed-loop arrivals, class shares, shapes, bounds."""

from __future__ import annotations

import itertools
import random
import statistics
from collections import Counter
from collections.abc import Iterator

import pytest

from obs.errors import ConfigError
from obs.loadgen.mix import CLASS_NAMES, load_mix
from obs.loadgen.plan import (
    Arrivals,
    Burst,
    bounded,
    iter_plan,
    plan,
    poisson_offsets,
    sessions,
)


def _take(offsets: Iterator[float], n: int) -> list[float]:
    return [next(offsets) for _ in range(n)]


def test_poisson_arrivals_match_the_rate() -> None:
    """20,000 arrivals at 50/s: mean gap 20 ms within 3%, exponential gaps (CV about 1)."""
    offsets = _take(poisson_offsets(50.0, random.Random(7)), 20_000)
    gaps = [b - a for a, b in zip([0.0, *offsets], offsets, strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(0.02, rel=0.03)
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, abs=0.05)
    assert all(g > 0 for g in gaps)


def test_bursts_raise_the_rate_inside_their_windows() -> None:
    """With a 4x burst 10 s of every 40 s, arrivals come at 80/s inside bursts, 20/s outside."""
    burst = Burst(every_s=40, length_s=10, factor=4)
    offsets = _take(poisson_offsets(20.0, random.Random(3), burst), 40_000)
    horizon = offsets[-1]
    burst_time = sum(
        max(0.0, min(start + 10, horizon) - start) for start in range(40, int(horizon) + 1, 40)
    )
    inside = sum(burst.active(t) for t in offsets)
    assert inside / burst_time == pytest.approx(80.0, rel=0.05)
    assert (len(offsets) - inside) / (horizon - burst_time) == pytest.approx(20.0, rel=0.05)


def test_bad_arrivals_are_rejected() -> None:
    """Arrivals need exactly one of rate and concurrency, positive; bursts need a rate."""
    for kwargs in ({}, {"rate": 1.0, "concurrency": 2}, {"rate": 0.0}, {"concurrency": 0}):
        with pytest.raises(ConfigError, match="arrivals"):
            Arrivals(**kwargs)
    with pytest.raises(ConfigError, match="bursts need"):
        Arrivals(concurrency=2, burst=Burst(10, 1, 2))
    with pytest.raises(ConfigError, match="burst"):
        Burst(every_s=10, length_s=10, factor=2)


def test_closed_loop_plan_has_no_offsets_and_is_bounded_by_count() -> None:
    """Closed loop: every offset is 0 and the plan holds exactly max_requests requests."""
    reqs = plan(load_mix(), 1, Arrivals(concurrency=4), max_requests=300)
    assert len(reqs) == 300 and {r.offset_s for r in reqs} == {0.0}
    assert [r.index for r in reqs] == list(range(300))
    with pytest.raises(ConfigError, match="unbounded"):
        plan(load_mix(), 1, Arrivals(concurrency=4), duration_s=10)


def test_open_loop_plan_is_bounded_by_duration_and_count() -> None:
    """Open loop: sessions arrive before the duration; the count caps it first if smaller."""
    mix = load_mix()
    by_time = plan(mix, 2, Arrivals(rate=10), duration_s=30)
    assert by_time and max(r.offset_s for r in by_time) < 30
    sessions_started = len({r.session for r in by_time})
    assert sessions_started == pytest.approx(300, rel=0.2)
    by_count = plan(mix, 2, Arrivals(rate=10), duration_s=30, max_requests=50)
    assert by_count == by_time[:50]


def test_class_shares_follow_the_weights() -> None:
    """Over 20,000 sessions each class's share is its weight's share within 1.5 points."""
    mix = load_mix(sets=["agent.turns=1"])
    reqs = plan(mix, 11, Arrivals(rate=100), max_requests=20_000)
    counts = Counter(r.client_class for r in reqs)
    total = sum(mix.weights().values())
    for name, weight in mix.weights().items():
        assert counts[name] / len(reqs) == pytest.approx(weight / total, abs=0.015)


def test_same_seed_same_plan_other_seed_other_plan() -> None:
    """The same seed gives the same classes, lengths and offsets; another seed does not."""
    mix = load_mix()
    a = plan(mix, 5, Arrivals(rate=3, burst=Burst(20, 5, 3)), duration_s=120)
    b = plan(mix, 5, Arrivals(rate=3, burst=Burst(20, 5, 3)), duration_s=120)
    c = plan(mix, 6, Arrivals(rate=3, burst=Burst(20, 5, 3)), duration_s=120)
    assert a == b and a != c


def test_changing_one_class_shape_keeps_arrivals_and_classes() -> None:
    """Changing one class's lengths moves neither the arrivals nor the class sequence."""
    base = plan(load_mix(), 9, Arrivals(rate=5), max_requests=400)
    other = plan(load_mix(sets=["chat.max_tokens=7"]), 9, Arrivals(rate=5), max_requests=400)
    assert [(r.offset_s, r.client_class) for r in base] == [
        (r.offset_s, r.client_class) for r in other
    ]
    assert {r.max_tokens for r in other if r.client_class == "chat"} == {7}


def test_rag_documents_recur_with_fixed_lengths() -> None:
    """Rag requests reuse a small set of documents, each always the same length."""
    mix = load_mix(sets=["rag.documents=3"])
    rag = [r for r in plan(mix, 4, Arrivals(rate=5), max_requests=500) if r.client_class == "rag"]
    docs = Counter(r.document for r in rag)
    assert set(docs) == {0, 1, 2} and min(docs.values()) > 5
    lengths = {(r.document, r.prefix_tokens) for r in rag}
    assert len(lengths) == 3
    lo, hi = mix.classes.rag.document_tokens
    assert all(lo <= t <= hi for _, t in lengths)


def test_agent_sessions_grow_their_context_turn_by_turn() -> None:
    """An agent session's turns are consecutive; each resends the earlier turns."""
    mix = load_mix(sets=[*(f"{c}.weight=0" for c in CLASS_NAMES if c != "agent")])
    reqs = plan(mix, 8, Arrivals(rate=1), max_requests=200)
    groups = list(sessions(reqs))
    assert sum(len(g) for g in groups) == 200
    lo, hi = mix.classes.agent.turns
    for turns in groups[:-1]:  # the last may be cut by max_requests
        assert lo <= len(turns) <= hi
        assert [t.turn for t in turns] == list(range(len(turns)))
        assert len({(t.offset_s, t.prefix_tokens) for t in turns}) == 1
        assert turns[0].think_s == 0 and all(t.think_s > 0 for t in turns[1:])
        for prev, nxt in itertools.pairwise(turns):
            assert nxt.history == (*prev.history, (prev.prompt_tokens, prev.max_tokens))
            assert nxt.total_prompt_tokens > prev.total_prompt_tokens


def test_bounded_stops_at_duration_or_count() -> None:
    """bounded() cuts an unbounded plan at either bound."""
    it = iter_plan(load_mix(), 3, Arrivals(rate=2))
    first = list(bounded(it, duration_s=5.0, max_requests=1000))
    assert first and all(r.offset_s < 5 for r in first)
    assert (
        len(list(bounded(iter_plan(load_mix(), 3, Arrivals(concurrency=1)), max_requests=7))) == 7
    )
