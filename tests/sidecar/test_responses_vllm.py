"""The Responses API (``/v1/responses``) through the sidecar, against a real ``vllm serve``:
the ``openai`` client's stream arrives whole (it ends with ``response.completed``, not
``[DONE]``), and the event has the usage and end the client read."""

from __future__ import annotations

import uuid
from typing import Any

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
    with _client(base, rid).responses.create(
        model="tiny", input=PROMPT, max_output_tokens=MAX_OUTPUT, temperature=0, stream=True
    ) as events:
        for ev in events:
            if not kinds or kinds[-1] != ev.type:
                kinds.append(ev.type)
            if ev.type == "response.output_text.delta":
                text += ev.delta
            last = ev
    return kinds, text, getattr(last, "response", None)


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
    ev = event_of(sc, rid)
    assert (ev["route"], ev["status"], ev["http_status"], ev["stream"]) == (
        "/v1/responses", "ok", 200, True,
    )  # fmt: skip
    assert ev["completion_tokens"] == response.usage.output_tokens > 0
    assert ev["prompt_tokens"] == response.usage.input_tokens
    assert ev["finish_reason"] == "length" and ev["ttft_ms"] is not None
    assert (ev["prompt_text"], ev["output_text"]) == (f"user: {PROMPT}", text)


def test_a_whole_response_has_its_usage_in_its_event(
    vllm: VllmServer, sidecar: SidecarFactory
) -> None:
    """A non-streamed response: the event's token counts and end are the answer's."""
    sc = sidecar(vllm.url, traces=False)
    rid = uuid.uuid4().hex
    answer = _client(sc.url, rid).responses.create(
        model="tiny", input=PROMPT, max_output_tokens=MAX_OUTPUT, temperature=0
    )
    ev = event_of(sc, rid)
    assert (ev["status"], ev["stream"]) == ("ok", False)
    assert answer.usage is not None
    assert ev["completion_tokens"] == answer.usage.output_tokens > 0
    assert ev["prompt_tokens"] == answer.usage.input_tokens
    assert ev["finish_reason"] == ("length" if answer.status == "incomplete" else "stop")
