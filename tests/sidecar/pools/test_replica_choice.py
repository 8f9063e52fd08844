"""Replica choice (``PoolSet.candidates``), pure: least outstanding, unhealthy last, affinity
bounded by load. No pool is contacted; the replicas' counts are set as the relay would."""

from __future__ import annotations

from obs.config import parse_config
from obs.sidecar.pools.pools import PoolSet

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
