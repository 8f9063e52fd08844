"""obs.sidecar.outcomes: each outcome's status, body, SSE frame and event record agree."""

from __future__ import annotations

import orjson
import pytest

from obs import conventions as c
from obs.events import Event
from obs.sidecar import outcomes as e
from obs.sidecar.policy.admission import Rejected

SENT = [
    e.BadRequest("bad"),
    e.Unauthorized("who"),
    e.PayloadTooLarge("big"),
    e.NotFound("where"),
    e.MethodNotAllowed("how"),
    e.UpstreamUnavailable("none up"),
    e.ShuttingDown("bye"),
    e.UpstreamTimeout("idle"),
    e.SlowClientStalled("stalled"),
    e.UpstreamProtocol("broken"),
    e.Internal(KeyError("k")),
    Rejected(c.QUEUE_FULL, "full", 429, 1),
]


def _frame_error(err: e.RelayError) -> dict[str, object]:
    data, done = err.sse_frame().split(b"\n\n", 1)
    assert done == b"data: [DONE]\n\n" and data.startswith(b"data: ")
    error: dict[str, object] = orjson.loads(data[len(b"data: ") :])["error"]
    return error


@pytest.mark.parametrize("err", SENT, ids=lambda err: type(err).__name__)
def test_frame_body_and_status_name_the_same_error(err: e.RelayError) -> None:
    """An error's SSE frame carries the type and code of its JSON body and HTTP status."""
    body = orjson.loads(err.body())["error"]
    frame = _frame_error(err)
    assert (frame["type"], frame["code"]) == (body["type"], body["code"]) == (err.type_, err.status)
    assert frame["message"] == body["message"] == err.message


@pytest.mark.parametrize("err", SENT, ids=lambda err: type(err).__name__)
def test_event_records_the_outcome_the_client_reads(err: e.RelayError) -> None:
    """The event's status follows the code the client reads: 4xx the client's, 5xx an error."""
    ev = Event()
    err.record(ev, "decode")
    expected = c.CLIENT_ERROR if 400 <= err.status < 500 else c.ERROR
    if isinstance(err, Rejected):
        expected = c.REJECTED
    assert (ev.status, ev.error_class, ev.error_phase) == (expected, err.error_class, "decode")


def test_idle_timeout_is_a_504_frame_and_an_upstream_timeout() -> None:
    """The idle timeout's frame is a 504 GatewayTimeoutError; the event says upstream_timeout."""
    err = e.UpstreamTimeout("the pool stopped sending while streaming (idle timeout: 1 s)")
    assert (_frame_error(err)["type"], _frame_error(err)["code"]) == ("GatewayTimeoutError", 504)
    ev = Event()
    err.record(ev, "decode")
    assert (ev.status, ev.error_class) == (c.ERROR, "upstream_timeout")


def test_refusals_record_their_reason() -> None:
    """A lane's refusal and vLLM's full queue are rejections; an unavailable pool is an error."""
    for err, status, reason in [
        (Rejected(c.QUEUE_FULL, "full", 429, 1), c.REJECTED, c.QUEUE_FULL),
        (e.pool_status(503, "queue full"), c.REJECTED, c.ENGINE_QUEUE_FULL),
        (e.UpstreamUnavailable("none"), c.ERROR, c.POOL_UNAVAILABLE),
    ]:
        ev = Event()
        err.record(ev, "queue")
        assert (ev.status, ev.rejection_reason) == (status, reason)


def test_pool_errors_are_judged_by_their_code() -> None:
    """The pool's error status or frame: a 4xx is the client's, a 5xx or no code the pool's."""
    cases: list[tuple[e.RelayError, str]] = [
        (e.pool_status(400, "bad"), c.CLIENT_ERROR),
        (e.pool_status(500, "oops"), c.ERROR),
        (e.PoolErrorFrame({"message": "m", "code": "404"}), c.CLIENT_ERROR),
        (e.PoolErrorFrame({"message": "m", "code": 500}), c.ERROR),
        (e.PoolErrorFrame({"message": "m"}), c.ERROR),
    ]
    for err, status in cases:
        ev = Event()
        err.record(ev, None)
        assert ev.status == status and ev.error_message == err.message


def test_internal_error_keeps_its_cause_in_the_event_only() -> None:
    """A sidecar fault: the client reads a plain 500, the event keeps the cause."""
    err = e.Internal(ValueError("x" * 400))
    assert b"ValueError" not in err.body()
    ev = Event()
    err.record(ev, None)
    assert ev.error_message is not None and "ValueError" in ev.error_message
    assert len(ev.error_message) == e.MAX_MESSAGE


def test_client_left_is_a_disconnect_without_a_message() -> None:
    """A client that left is recorded as client_disconnect, with no message of ours."""
    ev = Event()
    e.ClientLeft().record(ev, "decode")
    assert (ev.status, ev.error_class, ev.error_message) == (
        c.DISCONNECTED,
        "client_disconnect",
        None,
    )
