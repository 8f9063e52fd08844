"""The Responses API (``/v1/responses``, the ``openai`` client) and Anthropic's Messages API
(``/v1/messages``, the ``anthropic`` client) through the sidecar, against a real ``vllm
serve``: a stream arrives whole (it ends with ``response.completed`` or ``message_stop``, not
``[DONE]``), and the event has the usage and end the client read."""

from __future__ import annotations

import uuid
from typing import Any

import anthropic
import httpx
import openai
import pytest

from obs.engines.server import VllmServer
from tests.conftest import SidecarFactory
from tests.support import event_of

pytestmark = pytest.mark.engine

PROMPT = "Tell me about the sea."
MAX_OUTPUT = 6


def _client(base: str, rid: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=base + "/v1", api_key="x", max_retries=0, default_headers={"X-Request-Id": rid}
    )


def _stream(base: str, rid: str) -> tuple[list[str], str, Any]:
    """The event types (a run of one type once: vLLM may put two tokens in one delta from one
    request to the next), the text and the last event's response of one streamed request."""
    kinds: list[str] = []
    text, last = "", None
    with (
        _client(base, rid) as client,
        client.responses.create(
            model="tiny", input=PROMPT, max_output_tokens=MAX_OUTPUT, temperature=0, stream=True
        ) as events,
    ):
        for ev in events:
            if not kinds or kinds[-1] != ev.type:
                kinds.append(ev.type)
            if ev.type == "response.output_text.delta":
                text += ev.delta
            last = ev
    return kinds, text, getattr(last, "response", None)


def _streamed_event(ev: dict[str, Any], route: str, usage: Any, prompt: str, text: str) -> None:
    """A streamed answer's event: ok, the client's usage, a TTFT, cut at its max tokens
    (``length``), and the texts (the sidecar captures them)."""
    assert (ev["route"], ev["status"], ev["http_status"], ev["stream"]) == (route, "ok", 200, True)
    assert ev["completion_tokens"] == usage.output_tokens > 0
    assert ev["prompt_tokens"] == usage.input_tokens
    assert ev["finish_reason"] == "length" and ev["ttft_ms"] is not None
    assert (ev["prompt_text"], ev["output_text"]) == (prompt, text)


def test_a_streamed_response_arrives_whole_and_its_event_has_its_usage(
    vllm: VllmServer, sidecar: SidecarFactory
) -> None:
    """Through the sidecar the client gets the same events and text as directly, ending with
    ``response.completed``; the request's event is ok, with the usage the client read, a time
    to first token, the end (``length``: max_output_tokens) and, asked for, the texts."""
    sc = sidecar(vllm.url, traces=False, args=("--capture-text", "all"))
    direct = _stream(vllm.url, uuid.uuid4().hex)
    rid = uuid.uuid4().hex
    kinds, text, response = _stream(sc.url, rid)
    assert (kinds, text) == direct[:2]
    assert kinds[-1] == "response.completed"
    _streamed_event(event_of(sc, rid), "/v1/responses", response.usage, f"user: {PROMPT}", text)


def test_a_whole_response_has_its_usage_in_its_event(
    vllm: VllmServer, sidecar: SidecarFactory
) -> None:
    """A non-streamed response: the event's token counts and end are the answer's."""
    sc = sidecar(vllm.url, traces=False)
    rid = uuid.uuid4().hex
    with _client(sc.url, rid) as client:
        answer = client.responses.create(
            model="tiny", input=PROMPT, max_output_tokens=MAX_OUTPUT, temperature=0
        )
    ev = event_of(sc, rid)
    assert (ev["status"], ev["stream"]) == ("ok", False)
    assert answer.usage is not None
    assert ev["completion_tokens"] == answer.usage.output_tokens > 0
    assert ev["prompt_tokens"] == answer.usage.input_tokens
    assert ev["finish_reason"] == ("length" if answer.status == "incomplete" else "stop")


SYSTEM = "Be brief."


def _messages(base: str, rid: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=base, api_key="x", max_retries=0, default_headers={"X-Request-Id": rid}
    )


def _message_stream(base: str, rid: str) -> tuple[str, anthropic.types.Message]:
    """The text and the final message of one streamed Messages API request."""
    with (
        _messages(base, rid) as client,
        client.messages.stream(
            model="tiny",
            max_tokens=MAX_OUTPUT,
            system=SYSTEM,
            extra_body={"temperature": 0},  # greedy: the same text directly and relayed
            messages=[{"role": "user", "content": PROMPT}],
        ) as stream,
    ):
        text = "".join(stream.text_stream)
        return text, stream.get_final_message()


def test_a_streamed_message_arrives_whole_and_its_event_has_its_usage(
    vllm: VllmServer, sidecar: SidecarFactory
) -> None:
    """The ``anthropic`` client's stream through the sidecar: the same text as directly, its
    final message (``message_stop`` came); the event is ok, with the client's usage, a time to
    first token, the end (``max_tokens``: ``length``) and, asked for, the texts."""
    sc = sidecar(vllm.url, traces=False, args=("--capture-text", "all"))
    direct_text, _ = _message_stream(vllm.url, uuid.uuid4().hex)
    rid = uuid.uuid4().hex
    text, message = _message_stream(sc.url, rid)
    assert text == direct_text and message.stop_reason == "max_tokens"
    prompt = f"system: {SYSTEM}\nuser: {PROMPT}"
    _streamed_event(event_of(sc, rid), "/v1/messages", message.usage, prompt, text)


def test_a_whole_message_and_a_token_count_are_relayed_with_their_events(
    vllm: VllmServer, sidecar: SidecarFactory
) -> None:
    """A non-streamed message: its usage and end in the event; ``count_tokens`` is relayed;
    a model the pool does not serve gets the pool's own 404, recorded as the client's."""
    sc = sidecar(vllm.url, traces=False)
    rid = uuid.uuid4().hex
    ask: list[anthropic.types.MessageParam] = [{"role": "user", "content": PROMPT}]
    with _messages(sc.url, rid) as client:
        message = client.messages.create(model="tiny", max_tokens=MAX_OUTPUT, messages=ask)
        counted = client.messages.count_tokens(model="tiny", messages=ask)
    ev = event_of(sc, rid)
    assert (ev["status"], ev["stream"]) == ("ok", False)
    assert ev["completion_tokens"] == message.usage.output_tokens > 0
    assert ev["prompt_tokens"] == message.usage.input_tokens
    finish = {"max_tokens": "length", "end_turn": "stop"}[str(message.stop_reason)]
    assert ev["finish_reason"] == finish
    assert counted.input_tokens == message.usage.input_tokens
    with _messages(sc.url, "missing-model") as client, pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="nope", max_tokens=2, messages=ask)
    assert event_of(sc, "missing-model")["http_status"] == 404


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/chat/completions/batch", {"messages": [[{"role": "user", "content": "a"}],
                                                     [{"role": "user", "content": "b"}]]}),
        ("/invocations", {"messages": [{"role": "user", "content": "a"}]}),
    ],
)  # fmt: skip
def test_vllms_batch_chat_and_sagemaker_routes_answer_as_directly(
    vllm: VllmServer, sidecar: SidecarFactory, route: str, body: dict[str, Any]
) -> None:
    """vLLM's batch of chats and SageMaker's ``/invocations``: the same answer (greedy) as
    directly, one ok event under the route (before: the sidecar's 404)."""
    sc = sidecar(vllm.url, traces=False)
    body = {"model": "tiny", "max_tokens": 3, "temperature": 0, **body}
    direct = httpx.post(vllm.url + route, json=body, timeout=60)
    rid = uuid.uuid4().hex
    relayed = httpx.post(sc.url + route, json=body, headers={"x-request-id": rid}, timeout=60)
    assert direct.status_code == relayed.status_code == 200
    assert [c["message"] for c in relayed.json()["choices"]] == [
        c["message"] for c in direct.json()["choices"]
    ]
    ev = event_of(sc, rid)
    assert (ev["route"], ev["status"], ev["http_status"]) == (route, "ok", 200)
