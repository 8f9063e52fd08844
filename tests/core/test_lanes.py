"""obs.lanes, directly: the classifier's rules and the prompt-size estimate (unit + property)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from obs.config import Config, default_config_path, load_config, parse_config
from obs.lanes import CHARS_PER_TOKEN, Classifier, RequestAttrs, estimate_prompt_tokens

SHIPPED = load_config(default_config_path())


def _attrs(**kw: Any) -> RequestAttrs:
    base: dict[str, Any] = {
        "route": "/v1/chat/completions",
        "model": "m",
        "stream": True,
        "headers": {},
        "tenant": None,
        "max_tokens": None,
        "prompt_tokens": None,
    }
    return RequestAttrs(**{**base, **kw})


def _config(rules: list[tuple[str, dict[str, Any]]]) -> Config:
    """Lanes a, b, c (default c), each with the rules given for it, in order."""
    lanes = [
        {"name": n, "pool": "p", "match": [r for lane, r in rules if lane == n]}
        for n in ("a", "b", "c")
    ]
    return parse_config(
        {
            "pools": [{"name": "p", "replicas": ["http://127.0.0.1:9"]}],
            "lanes": lanes,
            "default_lane": "c",
        }
    )


def test_no_rule_matches_so_the_default_lane_takes_it() -> None:
    """A request no rule matches goes to the default lane."""
    cl = Classifier(_config([("a", {"route": "/v1/completions"})]))
    assert cl.classify(_attrs()).name == "c"


def test_rules_are_tried_lane_by_lane_first_match_wins() -> None:
    """When rules of two lanes match, the earlier lane wins, whatever the rules' order within."""
    cl = Classifier(_config([("b", {"stream": True}), ("a", {"model": "m"})]))
    assert cl.classify(_attrs()).name == "a"


def test_a_rule_needs_every_attribute_it_names() -> None:
    """Rule attributes are ANDed: one mismatch and the rule does not match."""
    cl = Classifier(_config([("a", {"model": "m", "stream": False}), ("b", {"model": "m"})]))
    assert cl.classify(_attrs(stream=True)).name == "b"
    assert cl.classify(_attrs(stream=False)).name == "a"


def test_header_rules_compare_names_case_insensitively() -> None:
    """A rule's header name in any case matches the request's lower-cased header."""
    cl = Classifier(_config([("a", {"header": {"X-Client-Class": "batch"}})]))
    assert cl.headers == ["x-client-class"]
    assert cl.classify(_attrs(headers={"x-client-class": "batch"})).name == "a"
    assert cl.classify(_attrs(headers={"x-client-class": "chat"})).name == "c"


def test_only_prompt_size_rules_make_the_relay_estimate_prompts() -> None:
    """needs_prompt_tokens is set by min/max_prompt_tokens rules only."""
    assert not Classifier(_config([("a", {"max_max_tokens": 9})])).needs_prompt_tokens
    assert Classifier(_config([("a", {"min_prompt_tokens": 9})])).needs_prompt_tokens
    assert Classifier(SHIPPED).needs_prompt_tokens


_bounds = st.one_of(st.none(), st.integers(min_value=1, max_value=10_000))


@given(_bounds, _bounds, st.one_of(st.none(), st.integers(min_value=0, max_value=20_000)))
def test_prompt_token_bounds_are_inclusive(lo: int | None, hi: int | None, pt: int | None) -> None:
    """A min/max_prompt_tokens rule matches exactly the estimates within [min, max]."""
    rule = {k: v for k, v in (("min_prompt_tokens", lo), ("max_prompt_tokens", hi)) if v}
    cl = Classifier(_config([("a", rule)]))
    n = pt or 0  # no estimate counts as 0 tokens
    inside = (lo is None or n >= lo) and (hi is None or n <= hi)
    assert (cl.classify(_attrs(prompt_tokens=pt)).name == "a") == inside


@given(_bounds, _bounds, st.one_of(st.none(), st.integers(min_value=0, max_value=20_000)))
def test_max_tokens_bounds_are_inclusive(lo: int | None, hi: int | None, mt: int | None) -> None:
    """A min/max_max_tokens rule matches exactly the max_tokens within [min, max]."""
    rule = {k: v for k, v in (("min_max_tokens", lo), ("max_max_tokens", hi)) if v}
    cl = Classifier(_config([("a", rule)]))
    n = mt or 0
    inside = (lo is None or n >= lo) and (hi is None or n <= hi)
    assert (cl.classify(_attrs(max_tokens=mt)).name == "a") == inside


_requests = st.builds(
    _attrs,
    route=st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
    model=st.sampled_from([None, "m", "n"]),
    stream=st.booleans(),
    headers=st.dictionaries(
        st.sampled_from(["x-client-class", "x-tenant"]), st.sampled_from(["batch", "rag"])
    ),
    tenant=st.sampled_from([None, "t1"]),
    max_tokens=st.one_of(st.none(), st.integers(0, 5000)),
    prompt_tokens=st.one_of(st.none(), st.integers(0, 50_000)),
)


@given(_requests)
def test_an_earlier_rule_that_never_matches_changes_nothing(a: RequestAttrs) -> None:
    """Putting a rule no request can match in front of the shipped rules keeps every verdict."""
    cl = Classifier(SHIPPED)
    data = SHIPPED.model_dump(by_alias=True)
    data["lanes"][0]["match"].insert(0, {"route": "/never"})
    assert Classifier(parse_config(data)).classify(a).name == cl.classify(a).name


@given(_requests)
def test_a_catch_all_rule_takes_every_request(a: RequestAttrs) -> None:
    """An empty rule matches everything: its lane takes every request."""
    cl = Classifier(_config([("b", {}), ("a", {"model": "x"})]))
    assert cl.classify(a).name == ("a" if a.model == "x" else "b")


@given(st.lists(st.text(max_size=200), max_size=5), st.text(max_size=200))
def test_prompt_estimate_counts_text_and_grows_with_it(texts: list[str], extra: str) -> None:
    """The estimate is at least 1, ~4 characters a token, and never shrinks as text is added."""
    msgs = [{"role": "user", "content": t} for t in texts]
    chars = sum(len(t) + 8 for t in texts)
    n = estimate_prompt_tokens({"messages": msgs})
    assert n == max(1, chars // CHARS_PER_TOKEN)
    more = estimate_prompt_tokens({"messages": [*msgs, {"role": "user", "content": extra}]})
    assert more >= n
