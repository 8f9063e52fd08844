"""A request's outcome is settled once: the first stands, and is what the client is answered."""

from __future__ import annotations

from obs import conventions as c
from obs.sidecar import outcomes as e
from obs.sidecar.relay.request import Request
from tests.support.probes import CHAT


def test_the_first_outcome_settled_stands() -> None:
    """A later outcome (the client leaving after the pool's timeout) neither rewrites the
    event nor replaces what is answered: settle returns the first."""
    req = Request(CHAT)
    first = e.UpstreamTimeout("the pool stopped sending")
    assert req.settle(first, "decode") is first
    assert req.settle(e.ClientLeft(), "stream") is first
    ev = req.event
    assert (ev.status, ev.error_class, ev.error_phase) == (c.ERROR, "upstream_timeout", "decode")


def test_an_unsettled_request_is_ok() -> None:
    """Nothing settled: the event keeps its ok status and no error fields."""
    req = Request(CHAT)
    assert req.outcome is None
    assert (req.event.status, req.event.error_class) == (c.OK, None)
