"""How a request ended, decided once: the values the sidecar's steps hand back, and the one
function that turns them into the outcome.

Policy decides and the relay's steps end; neither builds an outcome. A refusal is an
``outcomes.Refusal`` (whose rule refused, why, the status, when to retry): the lane's and the
pool's gates, the tenant check and the rate limiter return one; the server's connection
limits, the trace route and the request's parsers raise one (``outcomes.Refused``) from
where they cannot return. A relay step that ends otherwise than with the pool's whole
answer says so with an ``Ending`` (the client left, the pool cut its stream or sent an error
frame or status, a slow reader was cut off, ...). A deadline's verdict is the pool's
response's failure (``outcomes.Expired``): an
``Ending`` of kind ``FAILED`` carries it, or any lower exception, as its cause, and the
mapping table (``outcomes.LOWER``) decides it. ``outcome`` is the one place any of these
becomes the outcome (``obs.sidecar.outcomes``) whose status, body or frame the client is
answered and whose fields the event records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from obs.sidecar import outcomes as o

# How a relay step ended (``Ending.kind``), when not with the pool's whole answer.
LEFT = "left"  # the client went away before the end
CUT = "cut"  # the pool ended a generating stream without its last frame ([DONE])
POOL_FRAME = "pool_frame"  # the pool's error frame inside its stream (``frame``)
POOL_STATUS = "pool_status"  # the pool's error status (``status``; ``detail``: its message)
POOL_FAILED = "pool_failed"  # no head from the pool (``detail``: how; ``cause``: why)
SLOW_READER = "slow_reader"  # the client fell ``limit`` bytes behind (slow_client: abort)
UNAVAILABLE = "unavailable"  # no replica accepted a connection (``detail``: whose and why)
ANSWER_DEADLINE = "answer_deadline"  # a whole answer not whole within ``seconds``
SHUTDOWN = "shutdown"  # --shutdown-grace ended with the request still running
FAILED = "failed"  # a lower exception (``cause``) while ``detail``: the table decides
BUG = "bug"  # a fault in the sidecar itself (``cause``)

SHUTDOWN_MESSAGE = "the sidecar shut down before the request finished (--shutdown-grace ended)"


@dataclass(frozen=True, slots=True)
class Ending:
    """How a relay step ended (``kind``) and what the outcome needs of it."""

    kind: str
    detail: str = ""
    status: int = 0
    limit: int = 0
    seconds: float = 0.0
    frame: dict[str, Any] | None = None
    cause: BaseException | None = None


def outcome(ended: Ending | o.Refusal) -> o.RelayError:
    """The outcome of ``ended``: the one place a decision or a step's ending becomes what
    the client is answered and the event records."""
    if isinstance(ended, o.Refusal):
        return o.refused(ended)
    kind = ended.kind
    if kind == FAILED:
        assert ended.cause is not None
        return o.lower_outcome(ended.cause, ended.detail)
    if kind == LEFT:
        return o.ClientLeft()
    if kind == POOL_FRAME:
        return o.PoolErrorFrame(ended.frame or {})
    if kind == POOL_STATUS:
        return o.pool_status(ended.status, ended.detail)
    if kind == CUT:
        return o.UpstreamProtocol("the pool ended the stream without its last frame ([DONE])")
    if kind == POOL_FAILED:  # the pool broke, or a deadline closed it (its verdict decides)
        if isinstance(ended.cause, o.Expired):
            return o.lower_outcome(ended.cause, "waiting for the response")
        return o.UpstreamProtocol(ended.detail)
    if kind == SLOW_READER:
        return o.SlowClientStalled(
            f"the client fell more than {ended.limit} bytes behind the stream; aborted "
            "(slow_client)"
        )
    if kind == UNAVAILABLE:
        return o.UpstreamUnavailable(ended.detail)
    if kind == ANSWER_DEADLINE:
        return o.AnswerDeadline(
            f"the pool's answer was not whole within the lane's first_token_s "
            f"({ended.seconds:g} s): a non-streamed answer comes with its last "
            "token (stream it, or give the lane a longer first_token_s)"
        )
    if kind == SHUTDOWN:
        return o.ShuttingDown(SHUTDOWN_MESSAGE)
    assert kind == BUG, kind
    return o.Internal(ended.cause or RuntimeError(ended.detail))


def failed(cause: BaseException, doing: str) -> o.RelayError:
    """The outcome of ``cause`` raised while ``doing`` (a deadline's verdict among them)."""
    return outcome(Ending(FAILED, doing, cause=cause))
