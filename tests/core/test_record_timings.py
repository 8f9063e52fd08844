"""The derived timings of a record (obs.record) and the usage rules (obs.sidecar.relay.payloads).

Pure policy, tested directly: TPOT only where a cadence was seen, TTFT only for a
first token, counted tokens when the pool sent no usage, which streams the
sidecar may ask usage for.
"""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from obs import conventions as c
from obs.engines.view import apply_engine_view
from obs.events import Event
from obs.phases import Clock
from obs.record import Finished, fill_timings, tpot_ns
from obs.sidecar.relay.payloads import apply_usage, single_choice, usage_options, wants_usage
from obs.sidecar.relay.sse import StreamState
from obs.tracecontext import new_ids

MS = 1_000_000


def finished(
    tokens: int | None,
    reads: list[int],
    *,
    first_read: int = 1,
    stream: bool = True,
) -> Finished:
    """A request whose output reads arrived at ``reads`` (ms after it was received)."""
    clock = Clock(received=MS, dispatched=2 * MS)
    if reads:
        clock.first_up = clock.first_sent = MS + reads[0] * MS
        clock.last_up = MS + reads[-1] * MS
    clock.end = MS + (reads[-1] + 1 if reads else 5) * MS
    ev = Event(stream=stream, completion_tokens=tokens)
    gaps = [(b - a) * MS for a, b in itertools.pairwise(reads)]
    return Finished(ev, clock, 0, new_ids(None), gaps, first_read_chunks=first_read)


def test_tpot_spreads_the_time_over_tokens_after_the_first_read() -> None:
    """(last - first arrival) / (tokens - chunks of the first read)."""
    assert tpot_ns(finished(11, [10, 20, 30, 110])) == 100 * MS // 10
    assert tpot_ns(finished(11, [10, 110], first_read=6)) == 100 * MS // 5


def test_a_joined_engine_span_gives_the_pools_own_tpot() -> None:
    """With the engine's span joined, TPOT is the engine's decode over the tokens after the
    first, whatever the sidecar's reads (a starved sidecar's late reads stretch no TPOT)."""
    f = finished(11, [10, 20, 30, 410])  # the sidecar read the last token 380 ms late
    f.event.engine_view, f.event.engine_decode_ms = "joined", 30.0
    assert tpot_ns(f) == 3 * MS


def test_a_first_read_with_most_tokens_shows_no_cadence() -> None:
    """More than half the tokens in the first read: no TPOT on the sidecar's clock (two
    late tokens would carry the whole span); half or fewer: the span over the rest."""
    assert tpot_ns(finished(11, [10, 110], first_read=7)) is None
    assert tpot_ns(finished(11, [10, 110], first_read=6)) == 100 * MS // 5


def test_a_single_read_has_no_tpot_unless_the_engine_says() -> None:
    """All output in one read: no cadence seen; the joined engine span's decode stands in."""
    f = finished(10, [10], first_read=10)
    fill_timings(f)
    assert f.event.tpot_ms is None and f.event.itl_p50_ms is None
    f.event.engine_view, f.event.engine_decode_ms = "joined", 18.0
    fill_timings(f)
    assert f.event.tpot_ms == 2.0


def test_no_first_token_no_ttft() -> None:
    """An answer with no output (an error reply) has no TTFT even when bytes were sent."""
    f = finished(None, [])
    f.clock.first_sent = 4 * MS
    fill_timings(f)
    assert f.event.ttft_ms is None and f.event.tpot_ms is None


@given(
    tokens=st.integers(0, 5000),
    gaps=st.lists(st.integers(0, 1000), max_size=50),
    first_read=st.integers(1, 50),
)
def test_tpot_is_never_negative_and_needs_two_reads(
    tokens: int, gaps: list[int], first_read: int
) -> None:
    """TPOT is null without two reads or two tokens, or with most tokens in the first read,
    else non-negative and at most the span."""
    reads = [10]
    for g in gaps:
        reads.append(reads[-1] + g)
    f = finished(tokens, reads, first_read=first_read)
    t = tpot_ns(f)
    after = tokens - first_read
    if tokens < 2 or len(reads) < 2 or reads[-1] == reads[0] or 2 * after < tokens - 1:
        assert t is None
    else:
        assert t is not None and 0 <= t <= (reads[-1] - reads[0]) * MS


def test_usage_or_counted_tokens() -> None:
    """The pool's usage is exact; without it the tokens the frames carried are counted, said so."""
    ev = Event()
    apply_usage(ev, StreamState(output_frames=7, usage={"completion_tokens": 9}))
    assert (ev.completion_tokens, ev.tokens_source, ev.output_chunks) == (
        9,
        c.TOKENS_FROM_USAGE,
        7,
    )
    ev = Event()
    apply_usage(ev, StreamState(output_frames=7, tokens=8))
    assert (ev.completion_tokens, ev.tokens_source, ev.prompt_tokens) == (8, c.TOKENS_COUNTED, None)
    assert ev.output_chunks == 7
    ev = Event()
    apply_usage(ev, StreamState())
    assert (ev.completion_tokens, ev.tokens_source) == (None, None)


def test_which_streams_the_sidecar_asks_usage_for() -> None:
    """Single-choice streams only; continuous usage stays off when the sidecar asks."""
    assert single_choice({"n": 1, "prompt": [1, 2, 3]})
    assert single_choice({"prompt": ["one prompt"]})
    assert not single_choice({"n": 2})
    assert not single_choice({"best_of": 3})
    assert not single_choice({"prompt": ["a", "b"]})
    assert not single_choice({"prompt": [[1, 2], [3]]})
    body = {"stream_options": {"include_usage": False, "continuous_usage_stats": True}}
    assert not wants_usage(body)
    assert usage_options(body) == {"include_usage": True, "continuous_usage_stats": False}
    assert wants_usage({"stream_options": {"include_usage": True}})


def test_engine_span_counts_stand_in_for_missing_usage() -> None:
    """Without a usage frame the joined span's token counts are taken; usage is never replaced."""
    attrs = {"gen_ai.usage.prompt_tokens": 11, "gen_ai.usage.completion_tokens": 24}
    f = finished(20, [10, 20, 30])
    f.event.tokens_source = c.TOKENS_COUNTED
    apply_engine_view(f, attrs)
    assert (f.event.prompt_tokens, f.event.completion_tokens, f.event.tokens_source) == (
        11,
        24,
        c.TOKENS_FROM_ENGINE,
    )
    f = finished(20, [10, 20, 30])
    f.event.prompt_tokens, f.event.tokens_source = 9, c.TOKENS_FROM_USAGE
    apply_engine_view(f, {**attrs, "gen_ai.usage.completion_tokens": -3})
    assert (f.event.prompt_tokens, f.event.completion_tokens) == (9, 20)
