"""The Responses API's stored responses in the relay (``obs.sidecar.relay.stored``), pure:
which paths name one, the method each is served for, and which replicas a request that
names one is sent to. No pool is contacted."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from obs.config import parse_config
from obs.events import Event
from obs.sidecar.pools.homes import ResponseHomes
from obs.sidecar.pools.pools import PoolSet
from obs.sidecar.relay import stored

ID = "resp_0123456789abcdef"


def _pools() -> PoolSet:
    config = parse_config(
        {
            "pools": [
                {"name": "chat", "replicas": ["http://a:1", "http://b:1"]},
                {"name": "batch", "replicas": ["http://c:1"]},
            ],
            "lanes": [{"name": "main", "pool": "chat"}],
            "default_lane": "main",
        },
        "<test>",
    )
    return PoolSet(config, 60.0)


def _scope(path: str, query: bytes = b"") -> dict[str, Any]:
    return {"path": path, "query_string": query}


@pytest.mark.parametrize(
    ("path", "route"),
    [
        (f"/v1/responses/{ID}", stored.STORED_ROUTE),
        (f"/v1/responses/{ID}/cancel", stored.CANCEL_ROUTE),
        ("/v1/responses/resp_AbC-1.2:3", stored.STORED_ROUTE),
        ("/v1/responses/cancel", stored.STORED_ROUTE),  # a response whose id is "cancel"
        ("/v1/responses/cancel/cancel", stored.CANCEL_ROUTE),
        ("/v1/responses", None),
        ("/v1/responses/", None),
        ("/v1/responses/../admin", None),
        ("/v1/responses/.hidden", None),
        (f"/v1/responses/{ID}/", None),
        (f"/v1/responses/{ID}/cancel/", None),
        (f"/v1/responses/{ID}/input_items", None),
        ("/v1/responses/a%2Fb", None),
        ("/v1/responses/" + "a" * 201, None),
    ],
)
def test_only_a_stored_responses_own_paths_are_relayed(path: str, route: str | None) -> None:
    """A retrieval or cancellation of a well-formed id maps to its route template; any other
    path under /v1/responses/ is not a relayed route (the sidecar's own 404)."""
    assert stored.route_of(path) == route
    assert stored.is_stored(path) is (route is not None)


@given(st.text(max_size=60))
def test_a_relayed_id_never_carries_a_separator_or_an_escape(tail: str) -> None:
    """Whatever follows /v1/responses/, a path is relayed only when its id holds no slash,
    percent sign, space or dot-dot step the pool could read as another path."""
    path = "/v1/responses/" + tail
    if stored.is_stored(path):
        rid = tail.removesuffix("/cancel")
        assert rid and not set(rid) & set("/%? #\\") and rid != ".." and rid[0] != "."


def test_a_retrieval_is_a_get_and_everything_else_relayed_a_post() -> None:
    """GET for ``/v1/responses/{id}``; POST for its cancellation and every other route."""
    assert stored.method_of(stored.STORED_ROUTE) == "GET"
    posts = (stored.CANCEL_ROUTE, "/v1/responses", "/v1/chat/completions")
    assert [stored.method_of(r) for r in posts] == ["POST"] * 3


@pytest.mark.parametrize(
    ("query", "streams"),
    [(b"", False), (b"stream=true", True), (b"starting_after=3&stream=True", True),
     (b"stream=false", False), (b"stream=1", False), (b"streaming=true", False)],
)  # fmt: skip
def test_a_retrieval_asks_for_a_stream_only_with_stream_true(query: bytes, streams: bool) -> None:
    """``?stream=true`` (any case) is a streamed retrieval, as vLLM reads its query."""
    assert stored.streams(query) is streams


def test_a_follow_up_goes_to_the_pool_and_replica_of_the_response_it_continues() -> None:
    """``previous_response_id`` of a response made on the batch pool's replica: the event's
    pool becomes that pool and the replica is tried first; its answer's id is learned."""
    pools, homes = _pools(), ResponseHomes()
    (c,) = pools.replicas["batch"]
    homes.remember(ID, c)
    ev = Event(route="/v1/responses", pool="chat")
    plan = stored.plan(ev, _scope("/v1/responses"), {"previous_response_id": ID}, homes)
    assert plan is not None and ev.pool == "batch" and plan.home is c and not plan.lookup
    assert stored.candidates(plan, pools, "batch", None) == [c]
    stored.learn(plan, 200, "resp_next", c, homes)
    assert homes.home("resp_next") is c


def test_a_follow_up_of_an_unknown_response_looks_on_its_lanes_pool_only() -> None:
    """``previous_response_id`` this sidecar did not see made (another sidecar's): every
    replica of the lane's pool once (the batch pool's here), a 404 moving on; never the
    other pools' (a client cannot make every replica look)."""
    pools, homes = _pools(), ResponseHomes()
    (c,) = pools.replicas["batch"]
    ev = Event(route="/v1/responses", pool="batch")
    plan = stored.plan(ev, _scope("/v1/responses"), {"previous_response_id": ID}, homes)
    assert plan is not None and plan.lookup and plan.home is None and ev.pool == "batch"
    assert stored.candidates(plan, pools, "batch", None) == [c]
    assert stored.next_replica(plan, 404)


def test_a_new_conversation_is_no_lookup() -> None:
    """A response with no ``previous_response_id`` (or a non-string one) goes where its lane
    sends it, up to two replicas, and its 404 is final."""
    pools, homes = _pools(), ResponseHomes()
    for body in ({}, {"previous_response_id": None}, {"previous_response_id": 7}, None):
        plan = stored.plan(Event(route="/v1/responses"), _scope("/v1/responses"), body, homes)
        assert plan is not None and not plan.lookup and plan.home is None
        assert len(stored.candidates(plan, pools, "chat", None)) == 2
        assert not stored.next_replica(plan, 404)


def test_the_home_replica_comes_first_even_when_others_hold_fewer_requests() -> None:
    """A replica that holds the response is tried before a less loaded one of its pool."""
    pools, homes = _pools(), ResponseHomes()
    a, b = pools.replicas["chat"]
    a.outstanding = 5
    homes.remember(ID, a)
    ev = Event(route="/v1/responses", pool="chat")
    plan = stored.plan(ev, _scope("/v1/responses"), {"previous_response_id": ID}, homes)
    assert plan is not None
    assert stored.candidates(plan, pools, "chat", None) == [a, b]
    assert stored.candidates(None, pools, "chat", None) == [b, a]


def test_an_unknown_response_is_looked_for_on_its_pools_replicas_healthy_first() -> None:
    """A retrieval this sidecar did not see created: every replica of the lane's pool, once
    each, the healthy ones first; a 404 moves on to the next one, any other answer stops."""
    pools, homes = _pools(), ResponseHomes()
    a, b = pools.replicas["chat"]
    pools.mark_failed(a)
    ev = Event(route=stored.STORED_ROUTE, pool="chat")
    plan = stored.plan(ev, _scope(f"/v1/responses/{ID}", b"stream=true"), None, homes)
    assert plan is not None and plan.lookup and plan.home is None and ev.stream
    assert stored.candidates(plan, pools, "chat", None) == [b, a]
    assert stored.next_replica(plan, 404) and stored.next_replica(plan, 503)
    assert not stored.next_replica(plan, 200) and not stored.next_replica(plan, 400)
    assert not stored.next_replica(None, 404)


def test_a_known_retrieval_goes_to_its_replica_only() -> None:
    """A retrieval of a response this sidecar saw made: its replica first, no lookup."""
    pools, homes = _pools(), ResponseHomes()
    (c,) = pools.replicas["batch"]
    homes.remember(ID, c)
    ev = Event(route=stored.CANCEL_ROUTE, pool="chat")
    plan = stored.plan(ev, _scope(f"/v1/responses/{ID}/cancel"), None, homes)
    assert plan is not None and not plan.lookup and ev.pool == "batch"
    assert stored.candidates(plan, pools, "batch", None) == [c]


@pytest.mark.parametrize(
    ("body", "status", "answer_id", "learned"),
    [
        ({}, 200, "resp_x", True),
        ({"store": True}, 200, "resp_x", True),
        ({"store": False}, 200, "resp_x", False),  # the pool keeps nothing of it
        ({}, 400, "resp_x", False),
        ({}, 200, None, False),
    ],
)
def test_a_response_is_remembered_only_when_stored_and_answered(
    body: dict[str, Any], status: int, answer_id: str | None, learned: bool
) -> None:
    """Only a 2xx answer with an id, to a request that did not say ``store: false``."""
    pools, homes = _pools(), ResponseHomes()
    a = pools.replicas["chat"][0]
    plan = stored.plan(Event(route="/v1/responses"), _scope("/v1/responses"), body, homes)
    assert plan is not None
    stored.learn(plan, status, answer_id, a, homes)
    assert (homes.home("resp_x") is a) is learned


@pytest.mark.parametrize(
    ("route", "path", "body"),
    [
        (stored.STORED_ROUTE, f"/v1/responses/{ID}", None),
        (stored.CANCEL_ROUTE, f"/v1/responses/{ID}/cancel", None),
        ("/v1/responses", "/v1/responses", {"previous_response_id": ID}),
    ],
)
def test_a_lookup_that_finds_the_response_remembers_its_replica(
    route: str, path: str, body: dict[str, Any] | None
) -> None:
    """The replica that answered a lookup 2xx holds the named response: the next request
    naming it goes there first, without a lookup; a 404 teaches nothing."""
    pools, homes = _pools(), ResponseHomes()
    (c,) = pools.replicas["batch"]
    plan = stored.plan(Event(route=route, pool="chat"), _scope(path), body, homes)
    assert plan is not None and plan.lookup
    stored.learn(plan, 404, None, c, homes)
    assert homes.home(ID) is None
    stored.learn(plan, 200, None, c, homes)
    assert homes.home(ID) is c
    again = stored.plan(Event(route=route, pool="chat"), _scope(path), body, homes)
    assert again is not None and not again.lookup and again.home is c


def test_other_routes_have_no_stored_plan() -> None:
    """A chat completion names no stored response: the relay's usual choice applies."""
    ev = Event(route="/v1/chat/completions", pool="chat")
    assert stored.plan(ev, _scope("/v1/chat/completions"), {}, ResponseHomes()) is None
    assert ev.pool == "chat"
