"""Where stored responses live (``ResponseHomes``), pure: the most recent ids are kept, the
oldest go first, and the map never holds more than its limit."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from obs.sidecar.pools.homes import ResponseHomes
from obs.sidecar.pools.pools import Replica

A, B = Replica("p", "http://a:1"), Replica("p", "http://b:1")


def test_a_remembered_response_names_its_replica_and_an_unknown_one_none() -> None:
    """``home`` answers the replica a response was remembered on; None for any other id."""
    homes = ResponseHomes()
    homes.remember("resp_1", A)
    homes.remember("resp_2", B)
    assert (homes.home("resp_1"), homes.home("resp_2"), homes.home("resp_3")) == (A, B, None)


def test_past_the_limit_the_oldest_goes_and_a_remembered_again_one_is_recent() -> None:
    """With room for two, a third id pushes out the least recently remembered one."""
    homes = ResponseHomes(limit=2)
    homes.remember("old", A)
    homes.remember("mid", A)
    homes.remember("old", B)  # remembered again: now the most recent, on its new replica
    homes.remember("new", A)
    assert homes.home("mid") is None and homes.home("old") is B and homes.home("new") is A
    assert len(homes) == 2


def test_a_limit_below_one_is_refused() -> None:
    """A map that could hold nothing is a configuration mistake, refused by name."""
    with pytest.raises(ValueError, match="limit must be at least 1"):
        ResponseHomes(limit=0)


@given(st.lists(st.integers(0, 30), max_size=200), st.integers(1, 10))
def test_the_map_holds_the_last_distinct_ids_and_never_more_than_its_limit(
    ids: list[int], limit: int
) -> None:
    """After any sequence of ids, exactly the ``limit`` most recently remembered distinct
    ones are known, each on the replica it was last remembered on."""
    homes = ResponseHomes(limit=limit)
    last: dict[str, Replica] = {}
    for i, n in enumerate(ids):
        replica = A if i % 2 else B
        homes.remember(f"resp_{n}", replica)
        last.pop(f"resp_{n}", None)
        last[f"resp_{n}"] = replica
    kept = list(last)[-limit:]
    assert len(homes) == len(kept) <= limit
    assert all(homes.home(k) is last[k] for k in kept)
    assert all(homes.home(k) is None for k in list(last)[:-limit])
