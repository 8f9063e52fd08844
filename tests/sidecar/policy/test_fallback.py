"""The lane's fallback (``traffic.with_fallback``) against a scripted route: which pools are
tried, in which order, and what the event says; no server, no pool."""

from __future__ import annotations

import asyncio

import pytest

from obs import conventions as c
from obs.config import parse_config
from obs.sidecar import outcomes as e
from obs.sidecar.policy import traffic
from obs.sidecar.relay.request import Request
from tests.support.probes import CHAT

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


def _run(first: BaseException | None, started: bool = False) -> tuple[Request, list[str]]:
    """Route a request whose first pool does ``first`` (None: answers); the pools tried."""
    req = Request(CHAT)
    req.event.pool, req.started = "main", started
    req.event.stream = True  # a non-streamed request's timeout never falls back (traffic.py)
    tried: list[str] = []

    async def route(pool: str, may_fall_back: bool) -> None:
        tried.append(f"{pool}:{may_fall_back}")
        if pool == "main" and first is not None:
            raise first

    asyncio.run(traffic.with_fallback(req, LANE, route))
    return req, tried


def test_an_answering_pool_is_the_only_one_tried() -> None:
    """A pool that answers: no fallback, no fallback fields on the event."""
    req, tried = _run(None)
    assert tried == ["main:True"] and req.event.fallback_from is None


@pytest.mark.parametrize(
    ("first", "reason"),
    [
        (e.FallBack(c.FALLBACK_SERVER_ERROR), c.FALLBACK_SERVER_ERROR),
        (e.UpstreamTimeout("no first token"), c.FALLBACK_TIMEOUT),
    ],
    ids=["refused", "timeout"],
)
def test_a_refusal_or_an_early_timeout_goes_once_to_the_fallback(
    first: BaseException, reason: str
) -> None:
    """The first pool's refusal or timeout before the first byte: once to the fallback pool
    (which may not fall back again), the event naming where it came from and why."""
    req, tried = _run(first)
    assert tried == ["main:True", "spare:False"]
    ev = req.event
    assert (ev.pool, ev.fallback_from, ev.fallback_reason) == ("spare", "main", reason)


def test_a_timeout_after_the_stream_began_is_not_answered_twice() -> None:
    """Once the client has the response head, a timeout is the outcome: no second pool."""
    with pytest.raises(e.UpstreamTimeout):
        _run(e.UpstreamTimeout("idle"), started=True)
