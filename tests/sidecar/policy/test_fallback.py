"""The lane's fallback decision (``traffic.fallback_reason``): which failures send a request
once to the lane's fallback pool, with which reason, and how it ends otherwise (an ``Ending``
value, or None: the failure stands). Pure, and a decision only:
the relay owns the loop (tests/sidecar/relay/test_inproc_failover.py runs it end to end)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from obs import conventions as c
from obs.config import parse_config
from obs.sidecar import endings as end
from obs.sidecar import outcomes as e
from obs.sidecar.endings import Ending
from obs.sidecar.policy import traffic

CONFIG = parse_config(
    {
        "pools": [
            {"name": "main", "replicas": ["http://a:1"]},
            {"name": "spare", "replicas": ["http://b:1"]},
        ],
        "lanes": [{"name": "main", "pool": "main", "fallback": "spare"}],
        "default_lane": "main",
    },
    "<test>",
)
LANE = CONFIG.lanes[0]


def _reason(
    err: Exception, *, stream: bool = True, started: bool = False, gone: bool = False
) -> str | Ending | None:
    """The decision for ``err`` on the main pool of a lane that falls back to ``spare``."""
    fallback = traffic.fallback_pool(LANE, "main")
    return traffic.fallback_reason(err, LANE, fallback, stream=stream, started=started, gone=gone)


def test_the_fallback_is_another_pool_never_the_same() -> None:
    """A lane's fallback is its fallback pool, and none for a request already on that pool (a
    split lane's arm may be it)."""
    assert traffic.fallback_pool(LANE, "main") == "spare"
    assert traffic.fallback_pool(LANE, "spare") is None


@pytest.mark.parametrize(
    ("err", "reason"),
    [
        (e.FallBack(c.FALLBACK_SERVER_ERROR), c.FALLBACK_SERVER_ERROR),
        (e.FallBack(c.FALLBACK_UNAVAILABLE), c.FALLBACK_UNAVAILABLE),
        (e.UpstreamTimeout("no first token"), c.FALLBACK_TIMEOUT),
    ],
    ids=["refused", "unavailable", "timeout"],
)
def test_a_refusal_or_an_early_timeout_falls_back_with_its_reason(
    err: Exception, reason: str
) -> None:
    """The pool's refusal, or a streamed request's timeout before the first byte: the fallback,
    the event's reason naming why."""
    assert _reason(err) == reason


def test_a_timeout_after_the_stream_began_is_not_answered_twice() -> None:
    """Once the client has the response head, a timeout is the outcome: no second pool."""
    assert _reason(e.UpstreamTimeout("idle"), started=True) is None


def test_a_client_that_left_is_not_sent_to_a_second_pool() -> None:
    """Nobody waits for the answer: the timeout stands, no work on the fallback pool."""
    assert _reason(e.UpstreamTimeout("no first token"), gone=True) is None


def test_a_non_streamed_timeout_is_the_lanes_answer_deadline() -> None:
    """A whole answer's first byte is its last token: its timeout is the lane's deadline
    (the generation was under way), never sent to a second pool to be done twice."""
    ended = _reason(e.UpstreamTimeout("no answer"), stream=False)
    assert ended == Ending(end.ANSWER_DEADLINE, seconds=LANE.timeouts.first_token_s)
    assert isinstance(ended, Ending)
    made = end.outcome(ended)
    assert isinstance(made, e.AnswerDeadline) and "first_token_s" in made.message


def test_other_failures_stand_as_they_are() -> None:
    """A failure that is neither a refusal nor a timeout (the pool cut the stream) is the
    outcome itself: no decision (None), the relay re-raises it unchanged."""
    assert _reason(e.UpstreamError("cut mid-stream")) is None


@given(stream=st.booleans(), started=st.booleans(), gone=st.booleans())
def test_a_timeout_falls_back_only_before_the_client_has_anything(
    stream: bool, started: bool, gone: bool
) -> None:
    """For every state a timeout can find the request in, it falls back exactly when the
    request streams, nothing reached the client and the client still waits."""
    decided = _reason(e.UpstreamTimeout("t"), stream=stream, started=started, gone=gone)
    assert isinstance(decided, str) == (stream and not started and not gone)
