"""obs.lanes, directly: the classifier's rules and the prompt-size estimate (unit + property)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from obs.config import Config, default_config_path, load_config, parse_config
from obs.lanes import (
    CHARS_PER_TOKEN,
    Classifier,
    RequestAttrs,
    estimate_prompt_tokens,
    prompt_shape,
    response_format,
)

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


def _words(tokens: int) -> str:
    return "word " * (tokens * CHARS_PER_TOKEN // 5)


def _shipped(body: dict[str, Any], **kw: Any) -> tuple[str, str]:
    """The shipped lanes' verdict (lane, class_source) for a body, as the relay reads it."""
    shape = prompt_shape(body)
    a = _attrs(
        stream=body.get("stream") is True,
        max_tokens=body.get("max_tokens"),
        prompt_tokens=shape.tokens,
        tools=shape.tools,
        context_in=shape.context_in,
        n=body.get("n", 1),
        response_format=response_format(body),
        **kw,
    )
    lane, source = Classifier(SHIPPED).decide(a)
    return lane.name, source


_TOOL = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}


def test_shipped_lanes_recognise_agent_loops_by_their_tools() -> None:
    """A request declaring tools, or carrying tool calls and results, is agent (rule)."""
    first = {"messages": [{"role": "user", "content": "find it"}], "tools": [_TOOL]}
    loop = {
        "messages": [
            {"role": "system", "content": _words(1500)},
            {"role": "user", "content": "find it"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function"}]},
            {"role": "tool", "tool_call_id": "1", "content": _words(300)},
        ],
        "stream": True,
    }
    legacy = {"messages": [{"role": "user", "content": "x"}], "functions": [{"name": "f"}]}
    for body in (first, loop, legacy):
        assert _shipped(body) == ("agent", "rule")


def test_shipped_lanes_tell_rag_from_long_prefill_by_where_the_context_sits() -> None:
    """A document before a short last question is rag; one long user message is long-prefill."""
    in_system = {
        "messages": [
            {"role": "system", "content": "Answer from these documents:\n" + _words(2000)},
            {"role": "user", "content": "What does it say about the harbor?"},
        ],
        "stream": True,
    }
    in_earlier_turn = {
        "messages": [
            {"role": "user", "content": "Context:\n" + _words(2000)},
            {"role": "assistant", "content": "Understood."},
            {"role": "user", "content": "Summarise section two."},
        ],
        "stream": True,
    }
    one_long = {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": _words(5000)},
        ],
        "stream": True,
    }
    assert _shipped(in_system) == ("rag", "rule")
    assert _shipped(in_earlier_turn) == ("rag", "rule")
    assert _shipped(one_long) == ("long-prefill", "rule")


def test_shipped_lanes_send_a_recurring_long_prompt_to_rag() -> None:
    """A long streamed prompt whose opening was seen recently is rag, even in one message."""
    body = {"messages": [{"role": "user", "content": _words(3000)}], "stream": True}
    assert _shipped(body, prefix_seen=False)[0] == "long-prefill"
    assert _shipped(body, prefix_seen=True) == ("rag", "rule")


def test_shipped_lanes_recognise_batch_work_and_short_chat() -> None:
    """Long non-streamed input or answer, n > 1 or JSON extraction is batch; short is chat."""
    long_whole = {"messages": [{"role": "user", "content": _words(3000)}], "stream": False}
    several = {"messages": [{"role": "user", "content": "a name"}], "n": 4}
    extract = {
        "messages": [{"role": "user", "content": _words(800)}],
        "response_format": {"type": "json_object"},
    }
    chat = {"messages": [{"role": "user", "content": _words(200)}], "stream": True}
    long_answer = {"messages": [{"role": "user", "content": "write"}], "max_tokens": 2000}
    assert _shipped(long_answer)[0] == "batch"
    assert _shipped({**long_answer, "stream": True})[0] == "chat"
    assert _shipped(long_whole)[0] == "batch"
    assert _shipped(several)[0] == "batch"
    assert _shipped(extract)[0] == "batch"
    assert _shipped(chat) == ("chat", "default")


def test_a_learned_slow_reader_streams_in_the_slow_lane() -> None:
    """A learned slow reader's streamed request goes to slow-stream, its source learned."""
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    assert _shipped(body, slow_reader=True) == ("slow-stream", "learned")
    assert _shipped({**body, "stream": False}, slow_reader=True)[0] == "chat"


def test_a_class_header_is_believed_before_any_other_rule() -> None:
    """X-Client-Class decides even when another lane's rule (earlier in the file) matches."""
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    header = {"x-client-class": "chat"}
    assert _shipped(body, slow_reader=True, headers=header) == ("chat", "header")
    tools = {**body, "tools": [_TOOL]}
    assert _shipped(tools, headers={"x-client-class": "batch"}) == ("batch", "header")


def test_shape_rules_match_only_their_value() -> None:
    """tools, context_in, prefix_seen, min_n, response_format and slow_reader each filter."""
    cases: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = [
        ({"tools": True}, {"tools": True}, {"tools": False}),
        ({"context_in": "earlier"}, {"context_in": "earlier"}, {"context_in": "last"}),
        ({"prefix_seen": False}, {"prefix_seen": False}, {"prefix_seen": True}),
        ({"min_n": 2}, {"n": 3}, {"n": 1}),
        ({"response_format": ["json_schema"]}, {"response_format": "json_schema"}, {}),
        ({"slow_reader": True}, {"slow_reader": True}, {}),
    ]
    for rule, yes, no in cases:
        cl = Classifier(_config([("a", rule)]))
        assert cl.decide(_attrs(**yes))[0].name == "a", rule
        assert cl.decide(_attrs(**no))[0].name == "c", rule


def test_the_classifier_says_which_attributes_its_rules_need() -> None:
    """Shape, prefix and learned-reader work is done only when a rule reads it."""
    plain = Classifier(_config([("a", {"stream": True})]))
    assert not (plain.needs_shape or plain.needs_prefix or plain.needs_slow_reader)
    shipped = Classifier(SHIPPED)
    assert shipped.needs_shape and shipped.needs_prefix and shipped.needs_slow_reader


_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant"]), "content": st.text(max_size=300)}
)


@given(st.lists(_message, min_size=1, max_size=6))
def test_context_is_earlier_exactly_when_earlier_messages_outweigh_the_last(
    msgs: list[dict[str, str]],
) -> None:
    """context_in is earlier iff the text before the last message is longer than the last's."""
    sizes = [len(m["content"]) + 8 for m in msgs]
    shape = prompt_shape({"messages": msgs})
    assert shape.context_in == ("earlier" if sum(sizes[:-1]) > sizes[-1] else "last")
    assert shape.tokens == estimate_prompt_tokens({"messages": msgs})
    assert not shape.tools


def test_a_completion_prompt_is_all_last_and_response_format_defaults_to_text() -> None:
    """A completions prompt has no earlier context; no response_format reads as text."""
    assert prompt_shape({"prompt": "x" * 9000}).context_in == "last"
    assert prompt_shape({"prompt": [1, 2, 3]}).tokens == 3
    assert response_format({}) == "text"
    assert response_format({"response_format": {"type": "json_schema"}}) == "json_schema"
    assert response_format({"response_format": "bad"}) == "text"


_BIG = "x" * 36_000  # ~9,000 tokens: far past a 100-token limit


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "user", "content": "hi"}],
         "tools": [{"type": "function", "function": {"name": "f", "description": _BIG}}]},
        {"messages": [{"role": "user", "content": "hi"}],
         "functions": [{"name": "f", "parameters": {"description": _BIG}}]},
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "f", "arguments": _BIG}}]}]},
        {"messages": [{"role": "assistant", "function_call": {"name": "f", "arguments": _BIG}}]},
        {"messages": [{"role": "user", "content": "hi"}], "documents": [{"text": _BIG}]},
        {"prompt": [[7] * 9_000]},
        {"prompt": [[7] * 3_000, [8] * 3_000, [9] * 3_000]},
    ],
)  # fmt: skip
def test_prompt_estimate_counts_what_the_template_renders(body: dict[str, Any]) -> None:
    """Tools, functions, tool-call arguments, documents and nested token-id prompts count
    toward the estimate: a 36k-character prompt hidden there does not pass as 100 tokens."""
    assert estimate_prompt_tokens(body) >= 8_000


def test_prompt_estimate_survives_deep_nesting() -> None:
    """A tools value nested 100,000 deep is counted without exhausting the stack."""
    deep: Any = "leaf"
    for _ in range(100_000):
        deep = [deep]
    assert estimate_prompt_tokens({"messages": [], "tools": deep}) >= 1
