"""Replica choice (``PoolSet.candidates``), pure: least outstanding, unhealthy last, affinity
bounded by load. No pool is contacted; the replicas' counts are set as the relay would."""

from __future__ import annotations

from obs.config import parse_config
from obs.events import Event
from obs.sidecar.pools.pools import PoolSet, Replica

URLS = ["http://a:1", "http://b:1", "http://c:1"]


def _pools() -> PoolSet:
    config = parse_config(
        {
            "pools": [{"name": "p", "replicas": URLS}],
            "lanes": [{"name": "main", "pool": "p"}],
            "default_lane": "main",
        },
        "<test>",
    )
    return PoolSet(config, 60.0)


def test_fewest_outstanding_first_and_unhealthy_last() -> None:
    """Healthy replicas by outstanding requests, then the unhealthy ones, every replica once."""
    pools = _pools()
    a, b, c = pools.replicas["p"]
    a.outstanding, b.outstanding, c.outstanding = 3, 1, 0
    pools.mark_failed(c)
    assert [r.url for r in pools.candidates("p")] == ["http://b:1", "http://a:1", "http://c:1"]
    pools.mark_ok(c)
    assert pools.candidates("p")[0].url == "http://c:1"


def test_affinity_is_sticky_until_its_replica_is_overloaded() -> None:
    """One prefix key goes to one replica whatever the others hold, until that replica holds
    well past its share; then the key's next replica takes it."""
    pools = _pools()
    first = pools.candidates("p", "prefix-1")[0]
    for r in pools.replicas["p"]:
        r.outstanding = 1 if r is not first else 0
    assert pools.candidates("p", "prefix-1")[0] is first
    first.outstanding = 50
    assert pools.candidates("p", "prefix-1")[0] is not first


def test_a_replica_counts_the_requests_and_prompt_tokens_sent_while_one_is_in_flight() -> None:
    """The lease stamps on the request's event the requests and estimated prompt tokens sent
    to the replica while it was in flight (its own not counted)."""
    replica = Replica("p", "http://127.0.0.1:1")
    ev = Event(lane="chat")
    with replica.lease(51, ev):
        with replica.lease(40):
            pass
        with replica.lease(60):
            pass
    assert (ev.pool_requests_during, ev.pool_prompt_tokens_during) == (2, 100)
