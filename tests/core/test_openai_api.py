"""obs.openai_api: one reading of prompts and output for lanes, capture, fingerprint, loadgen.

The reasoning-model frames below are written by hand: the tiny CPU models this project
runs have no reasoning parser, so no real engine here emits ``reasoning_content``.
Their shape is vLLM's (``delta.reasoning_content`` before ``delta.content``).
"""

from __future__ import annotations

import json
import math
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from obs.lanes import estimate_prompt_tokens
from obs.loadgen.measure import Measurement
from obs.loadgen.sse import parse_chunk
from obs.openai_api import (
    BadField,
    choice_carries_output,
    choice_tokens,
    content_texts,
    event_text,
    messages,
    prefix_text,
    prompt_text,
    read_request,
)
from obs.sidecar import outcomes
from obs.sidecar.relay.payloads import dump_body, fingerprint, request_headers, try_json
from obs.sidecar.relay.sse import StreamState, classify, classify_parsed

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def _frame(choice: dict[str, Any]) -> bytes:
    obj = {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _delta(**delta: Any) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}


def test_prompt_text_reads_multimodal_parts_by_their_text() -> None:
    """Chat content parts count by their text; image parts add nothing."""
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, IMAGE]}]}
    assert prompt_text(body) == "user: hi"
    assert prefix_text(body) == "hi"


_TEXT = st.text(max_size=8)
_CONTENT = (
    _TEXT
    | st.none()
    | st.integers()
    | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _TEXT}) | st.just(IMAGE))
)
_MESSAGE = st.fixed_dictionaries({"role": st.just("user"), "content": _CONTENT}) | st.integers()


@given(st.lists(_MESSAGE, max_size=5))
def test_prefix_text_runs_every_message_s_text_together(msgs: list[Any]) -> None:
    """A chat body's prefix text is each object message's content texts, in order, joined;
    a body whose first message is no object has none (nor a prompt)."""
    body = {"messages": msgs}
    texts = [t for m in messages(body) or [] for t in content_texts(m.get("content"))]
    first_is_object = bool(msgs) and isinstance(msgs[0], dict)
    assert prefix_text(body) == ("".join(texts) if first_is_object else None)


def test_fingerprint_hashes_text_not_the_python_repr_of_parts() -> None:
    """A multimodal message fingerprints like the same text sent as a string."""
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}, IMAGE]}]}
    plain = {"messages": [{"role": "user", "content": "hello"}]}
    other_image = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
    }
    assert fingerprint(parts) == fingerprint(plain) == fingerprint(other_image)
    assert fingerprint({"prompt": [1, 2, 3]}) is None


def test_capture_and_lanes_read_the_same_prompt_text() -> None:
    """The captured prompt and the lane estimate read the same text of a request."""
    body = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "x" * 400}, IMAGE]},
        ]
    }
    text = prompt_text(body)
    assert text == "system: be brief\nuser: " + "x" * 400
    # 8 characters of role and template per message, ~4 characters a token.
    assert estimate_prompt_tokens(body) == (len("be brief") + 400 + 2 * 8) // 4


def test_completion_prompts_as_strings_and_token_ids() -> None:
    """A list of strings is text; token ids are no text but count in the estimate."""
    assert prompt_text({"prompt": ["a", "b"]}) == "a\nb"
    assert prompt_text({"prompt": [1, 2]}) == ""
    assert estimate_prompt_tokens({"prompt": [1, 2, 3, 4]}) == 4


REASONING_STREAM = [
    _frame(_delta(role="assistant", content="")),
    _frame(_delta(reasoning_content="Let me")),
    _frame(_delta(reasoning_content=" think")),
    _frame(_delta(content="Hi")),
    _frame({"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}),
]


def test_client_and_sidecar_ttft_end_at_the_same_chunk_on_a_reasoning_model() -> None:
    """The load generator and the sidecar both take the first reasoning chunk as first output."""
    state = StreamState()
    sidecar = [classify(f, state)[0] for f in REASONING_STREAM]
    m = Measurement(start_ns=0)
    client = []
    for t, f in enumerate(REASONING_STREAM, start=1):
        chunk = parse_chunk(f[6:].strip())
        assert chunk is not None
        m.chunk(chunk, t)
        client.append(chunk.output)
    assert sidecar == client == [False, True, True, True, True]
    assert m.first_ns == 2  # the first reasoning chunk, not the first content chunk
    assert state.output_frames == m.output_chunks == 4


_text = st.one_of(st.none(), st.just(""), st.text(max_size=5))
_deltas = st.fixed_dictionaries(
    {},
    optional={
        "role": st.just("assistant"),
        "content": _text,
        "reasoning_content": _text,
        "reasoning": _text,
        "tool_calls": st.one_of(
            st.just([]), st.just([{"index": 0, "function": {"arguments": "{"}}])
        ),
        "function_call": st.one_of(st.none(), st.just({"name": "f", "arguments": ""})),
    },
)
_logprobs = st.sampled_from(
    [None, None, {"content": [{"token": ""}, {"token": "a"}]}, {"content": None}, {"tokens": ["a"]}]
)
_ids = st.sampled_from([None, None, [], [1], [1, 2, 3]])
_choices = st.one_of(
    st.builds(
        lambda d, fr, lp, ids: {
            "index": 0,
            "delta": d,
            "logprobs": lp,
            "finish_reason": fr,
            "token_ids": ids,
        },
        _deltas,
        st.sampled_from([None, "stop", "length", "tool_calls"]),
        _logprobs,
        _ids,
    ),
    st.builds(
        lambda t, fr, lp, ids: {
            "index": 0,
            "text": t,
            "logprobs": lp,
            "finish_reason": fr,
            "token_ids": ids,
        },
        _text,
        st.sampled_from([None, "stop"]),
        _logprobs,
        _ids,
    ),
)


@given(_choices)
def test_sidecar_and_loadgen_agree_on_every_chunk(choice: dict[str, Any]) -> None:
    """For any one-choice chunk, the sidecar (fast and parsed) and the client count the same
    tokens, so both see output at the same chunk."""
    frame = _frame(choice)
    chunk = parse_chunk(frame[6:].strip())
    assert chunk is not None
    expected = choice_tokens(choice)
    assert (chunk.tokens, chunk.output) == (expected, expected > 0)
    assert choice_carries_output(choice) == (expected > 0)
    assert classify(frame, StreamState())[0] == expected
    assert classify_parsed(frame, StreamState())[0] == expected


def test_token_count_of_a_choice() -> None:
    """Empty text is a token, the role frame none, a listed frame what it lists."""
    assert choice_tokens(_delta(content="")) == 1
    assert choice_tokens(_delta(role="assistant", content="")) == 0
    assert choice_tokens(_delta(role=None, content="")) == 1  # SGLang's token frames
    assert choice_tokens(_delta(content=None)) == 0
    assert choice_tokens({"index": 0, "text": "", "finish_reason": None}) == 1
    assert choice_tokens({**_delta(content="ab"), "token_ids": [4, 5]}) == 2
    logprobs = {"content": [{"token": "a"}, {"token": "b"}, {"token": ""}]}
    assert choice_tokens({**_delta(content="ab"), "logprobs": logprobs}) == 3


# ---- reading fields as vLLM does (issue 25) --------------------------------------------


@given(st.integers(1, 10**9), st.sampled_from([str, float, int]), st.booleans())
def test_max_tokens_reads_loose_types_as_pydantic_lax_mode(n: int, kind: type, chat: bool) -> None:
    """ "N", N.0 and N all read as the integer N, in either field vLLM reads."""
    value = kind(n)
    assert read_request({"max_tokens": value}, chat=chat).max_tokens == n
    if chat:
        assert read_request({"max_completion_tokens": value}, chat=True).max_tokens == n


@given(st.one_of(st.none(), st.integers(1, 10**6)), st.one_of(st.none(), st.integers(1, 10**6)))
def test_chat_reads_max_completion_tokens_before_max_tokens(
    mt: int | None, mct: int | None
) -> None:
    """A chat's cap is max_completion_tokens unless it is null; a completion's is max_tokens."""
    body = {"max_tokens": mt, "max_completion_tokens": mct}
    assert read_request(body, chat=True).max_tokens == (mct if mct is not None else mt)
    assert read_request(body, chat=False).max_tokens == mt


@pytest.mark.parametrize(
    ("value", "stream"), [(1, True), (0, False), ("yes", True), ("false", False), (None, False)]
)
def test_stream_reads_loose_booleans(value: object, stream: bool) -> None:
    """``"stream": 1`` or ``"yes"`` is a stream to vLLM, and to the sidecar."""
    assert read_request({"stream": value}, chat=True).stream is stream


@pytest.mark.parametrize(
    ("body", "field"),
    [({"max_tokens": 2.5}, "max_tokens"), ({"model": 7}, "model"), ({"stream": 2}, "stream"),
     ({"max_tokens": math.inf}, "max_tokens")],
)  # fmt: skip
def test_a_value_vllm_refuses_names_its_field(body: dict[str, Any], field: str) -> None:
    """Strict reading raises BadField naming the field; loose reading drops just that field."""
    with pytest.raises(BadField) as err:
        read_request(body, chat=True)
    assert err.value.field == field
    assert read_request({**body, "model": "m"} if field != "model" else body, chat=True,
                        strict=False).max_tokens is None  # fmt: skip


_json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.floats(), st.integers(), st.text()),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=10,
)  # fmt: skip


@given(st.dictionaries(st.text(max_size=8), _json_values, max_size=4))
def test_try_json_reads_what_pythons_json_reads_and_writes_it_back(body: dict[str, Any]) -> None:
    """Any object Python's json reads (NaN, Infinity, surrogates) the sidecar reads the same,
    and its written form reads back to the same values."""
    raw = json.dumps(body).encode()
    parsed = try_json(raw)
    assert parsed is not None
    assert json.dumps(parsed, sort_keys=True) == json.dumps(json.loads(raw), sort_keys=True)
    assert json.dumps(json.loads(dump_body(parsed)), sort_keys=True) == json.dumps(
        json.loads(raw), sort_keys=True
    )


@pytest.mark.parametrize(
    "raw",
    [b'{"seed": 123456789012345678901234}', b'{"a": [1, {"b": -98765432109876543210}]}',
     b'{"max_tokens": 18446744073709551616}', b'{"t": "call 12345678901234567890", "n": 7}',
     b'{"n": 1234567890123456789}'],
)  # fmt: skip
def test_try_json_keeps_integers_past_64_bits_exact(raw: bytes) -> None:
    """An integer of 19 or more digits reads as Python's json reads it (an exact int), as vLLM
    reads it, never as orjson's float."""
    assert try_json(raw) == json.loads(raw)
    assert json.loads(dump_body(try_json(raw) or {})) == json.loads(raw)


@pytest.mark.parametrize("name", [b"authorization", b"x-request-id", b"traceparent"])
def test_a_single_header_twice_is_refused_and_others_are_joined(name: bytes) -> None:
    """Two authorization, x-request-id or traceparent headers are a 400 (a proxy in front could
    read the other one); any other header may repeat, its values joined with ', ' as HTTP reads
    a repeated field (RFC 9110 5.3), never one of them picked."""
    headers = [(b"accept", b"a"), (name, b"1"), (b"accept", b"b"), (name, b"2")]
    with pytest.raises(outcomes.Refused, match=name.decode()) as refused:
        request_headers({"headers": headers})
    assert refused.value.refusal.status == 400
    assert request_headers({"headers": headers[:3]}) == {"accept": "a, b", name.decode(): "1"}


def test_event_text_cuts_and_makes_a_lone_surrogate_writable() -> None:
    """A model with a lone surrogate becomes valid UTF-8 (orjson can write the event)."""
    text = event_text("a\ud800" + "b" * 300, 256)
    assert text is not None and len(text) == 256
    orjson.dumps(text)
