"""The weighted split (obs.splits) and the split/fallback/priority config it reads."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from obs import splits
from obs.config import parse_config
from obs.errors import ConfigError

weights = st.lists(st.integers(1, 1000), min_size=1, max_size=6)


def _arms(ws: list[int]) -> list[tuple[str, int]]:
    return [(f"p{i}", w) for i, w in enumerate(ws)]


@given(weights, st.text(max_size=40))
def test_choose_is_stable_and_names_an_arm(ws: list[int], who: str) -> None:
    """The same identity always gets the same arm, and it is one of the split's arms."""
    arms = _arms(ws)
    got = splits.choose(arms, who)
    assert got == splits.choose(arms, who)
    assert got in {p for p, _ in arms}


@given(st.text(max_size=40))
def test_point_is_in_the_unit_interval(who: str) -> None:
    """An identity's point lies in [0, 1)."""
    assert 0 <= splits.point(who) < 1


@given(st.integers(1, 99), st.integers(1, 99), st.text(max_size=40))
def test_raising_the_canary_weight_only_moves_clients_onto_it(
    base: int, extra: int, who: str
) -> None:
    """Raising the last arm's weight moves identities onto that arm, never off it."""
    before = splits.choose([("stable", 100), ("canary", base)], who)
    after = splits.choose([("stable", 100), ("canary", base + extra)], who)
    assert not (before == "canary" and after == "stable")


def test_choose_shares_identities_by_weight() -> None:
    """Over 20,000 identities each arm's share is within 4 binomial sd of its weight."""
    arms = [("a", 95), ("b", 5)]
    n = 20_000
    got = Counter(splits.choose(arms, f"client-{i}") for i in range(n))
    sd = math.sqrt(n * 0.05 * 0.95)
    assert abs(got["b"] - n * 0.05) < 4 * sd, got


@pytest.mark.parametrize("bad", [[], [("a", 0)], [("a", 1), ("b", -1)]])
def test_choose_refuses_an_empty_or_non_positive_split(bad: list[tuple[str, int]]) -> None:
    """No arms, or a weight that is not positive, is an error, not a silent pick."""
    with pytest.raises(ValueError, match="split"):
        splits.choose(bad, "x")


def _config(lane: dict[str, object]) -> dict[str, object]:
    return {
        "pools": [
            {"name": "a", "replicas": ["http://127.0.0.1:1"]},
            {"name": "b", "replicas": ["http://127.0.0.1:2"]},
        ],
        "lanes": [{"name": "l", **lane}],
        "default_lane": "l",
    }


def test_a_split_lane_takes_its_heaviest_arm_as_its_pool_and_dumps_without_it() -> None:
    """``split`` in place of ``pool``: the baseline is the heaviest arm; a dump validates again."""
    cfg = parse_config(_config({"split": {"b": 5, "a": 95}, "fallback": "a"}))
    lane = cfg.lane("l")
    assert lane.pool == "a" and lane.canaries == ("b",)
    assert lane.arms == (("b", 5), ("a", 95)) and lane.pools == ("b", "a")
    assert parse_config(cfg.model_dump(by_alias=True)) == cfg


@pytest.mark.parametrize(
    ("lane", "message"),
    [
        ({"pool": "a", "split": {"a": 1, "b": 1}}, "either pool or split"),
        ({"split": {"a": 1}}, "at least two pools"),
        ({"split": {"a": 0, "b": 1}}, "greater than 0"),
        ({"split": {"a": 1, "zz": 1}}, "unknown pool 'zz'"),
        ({"pool": "a", "fallback": "a"}, "fallback loop"),
        ({"pool": "a", "fallback": "zz"}, "unknown pool 'zz'"),
        ({"pool": "a", "canary": {"sticky": "tenant"}}, "only a lane with a split"),
        ({"pool": "a", "priority": {"default": 10}}, "less than or equal to 9"),
    ],
)
def test_bad_traffic_control_is_refused_naming_the_field(
    lane: dict[str, object], message: str
) -> None:
    """Both pool and split, a one-arm split, zero weights, unknown pools, a fallback to the
    lane's own pool, a canary block without a split, an out-of-range priority: refused."""
    with pytest.raises(ConfigError, match=message):
        parse_config(_config(lane))


def test_the_salt_decides_the_arms() -> None:
    """Keyed with a salt, identities land elsewhere than unsalted (found offline), and the
    same salt always gives the same arm."""
    arms = [("stable", 95), ("canary", 5)]
    who = [f"key:{i}" for i in range(2000)]
    plain = [splits.choose(arms, w) for w in who]
    salted = [splits.choose(arms, w, b"s" * 32) for w in who]
    assert salted == [splits.choose(arms, w, b"s" * 32) for w in who]
    found_offline = {w for w, a in zip(who, plain, strict=True) if a == "canary"}
    still = {w for w, a in zip(who, salted, strict=True) if a == "canary"} & found_offline
    assert len(still) < len(found_offline) / 2  # ~5% of them, by chance


def test_identity_hash_is_keyed_and_short() -> None:
    """The event's identity is 16 hex characters, differs by salt, and is not the identity."""
    a, b = splits.identity_hash("key:abc", b"x" * 16), splits.identity_hash("key:abc", b"y" * 16)
    assert len(a) == 16 and a != b and "abc" not in a
