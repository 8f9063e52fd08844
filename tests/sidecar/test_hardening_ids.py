"""Ids a client must not predict (issue 63): the sidecar's span id keeps a forged engine span out
of its trace, so its ids come from the kernel's CSPRNG, not the ``random`` module's Mersenne
Twister, whose whole state a client reads back from 624 32-bit outputs it has seen.

The attack is run as a client would run it: it collects ids, rebuilds the generator's state
and predicts the next ones (on the code before, every prediction came true).
"""

from __future__ import annotations

import multiprocessing
import random

import pytest

from obs.tracecontext import new_ids, new_request_id, new_span_id

MT_WORDS = 624


def _undo_shift_right(y: int, shift: int) -> int:
    x = y
    for _ in range(32 // shift + 1):
        x = y ^ (x >> shift)
    return x & 0xFFFFFFFF


def _undo_shift_left(y: int, shift: int, mask: int) -> int:
    x = y
    for _ in range(32 // shift + 1):
        x = y ^ ((x << shift) & mask)
    return x & 0xFFFFFFFF


def _untemper(y: int) -> int:
    """The Mersenne Twister's state word behind one 32-bit output."""
    y = _undo_shift_right(y, 18)
    y = _undo_shift_left(y, 15, 0xEFC60000)
    y = _undo_shift_left(y, 7, 0x9D2C5680)
    return _undo_shift_right(y, 11)


def _predictor(ids: list[int]) -> random.Random:
    """A generator in the state the 64-bit ids (two words each, low word first, as
    ``getrandbits(64)`` draws them) leave the ``random`` module in."""
    words = [w for i in ids for w in (i & 0xFFFFFFFF, i >> 32)][-MT_WORDS:]
    rng = random.Random()
    rng.setstate((3, (*[_untemper(w) for w in words], MT_WORDS), None))
    return rng


def test_the_predictor_reads_a_mersenne_twister_back() -> None:
    """The attack works on the generator the ids came from before: 312 seen, the next 20
    predicted exactly (so the test below would catch ids from ``random``)."""
    source = random.Random(63)
    seen = [source.getrandbits(64) for _ in range(MT_WORDS // 2)]
    rng = _predictor(seen)
    assert [rng.getrandbits(64) for _ in range(20)] == [source.getrandbits(64) for _ in range(20)]


@pytest.mark.parametrize(
    "draw",
    [new_span_id, lambda: int(new_request_id(), 16), lambda: new_ids(None).span_id],
    ids=["span_id", "request_id", "request_span_id"],
)
def test_span_and_request_ids_cannot_be_predicted(draw) -> None:
    """312 ids seen in a row: none of the next 20 is the one the Mersenne Twister rebuilt
    from them names (before: all 20)."""
    seen = [draw() for _ in range(MT_WORDS // 2)]
    rng = _predictor(seen)
    predicted = [rng.getrandbits(64) for _ in range(20)]
    assert not set(predicted) & {draw() for _ in range(20)}


def _child_ids(out: multiprocessing.Queue) -> None:
    out.put([new_span_id() for _ in range(100)])


@pytest.mark.process
def test_a_forked_worker_never_repeats_its_parents_ids() -> None:
    """After ``fork`` (``--workers``) parent and child draw different ids: the child does
    not hand out the batch its parent had drawn."""
    new_span_id()  # the parent holds a drawn batch
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_ids, args=(out,))
    child.start()
    theirs = out.get(timeout=60)
    child.join(timeout=60)
    ours = [new_span_id() for _ in range(100)]
    assert not set(ours) & set(theirs)
