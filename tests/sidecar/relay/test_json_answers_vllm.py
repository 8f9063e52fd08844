"""The invalid-JSON rate with a real vLLM: json_object answers counted on /metrics.

The tiny random-weight model writes what it writes: each answer is judged here by the
client (``json.loads`` of the whole text it received) and the sidecar's counts of valid
and invalid answers must equal the client's, per lane and model; a plain request is not
counted. Whether a short answer happens to be whole JSON is the model's draw (CI once saw
six of six valid), so one pair is cut off for certain: one token, with the vocabulary's
one-token objects (``{}``, `` {}``, asked of vLLM's own ``/tokenize``) biased away.
Reuses the session's ``vllm serve``.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionUserMessageParam
from openai.types.shared_params import ResponseFormatJSONObject

from obs import conventions as c
from obs.engines.server import VllmServer
from tests.conftest import SidecarFactory
from tests.support import probes

pytestmark = pytest.mark.engine

JSON_MODE: ResponseFormatJSONObject = {"type": "json_object"}
ASK: list[ChatCompletionUserMessageParam] = [
    {"role": "user", "content": "Answer in JSON: the capital of Norway."}
]


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _one_token_objects(vllm: VllmServer) -> dict[str, int]:
    """logit_bias that bans every token that is a whole JSON object on its own."""
    banned: dict[str, int] = {}
    for text in ("{}", " {}"):
        answer = httpx.post(vllm.url + "/tokenize", json={"model": "tiny", "prompt": text})
        answer.raise_for_status()
        tokens = answer.json()["tokens"]
        if len(tokens) == 1:
            banned[str(tokens[0])] = -100
    return banned


def test_json_object_answers_are_counted_valid_or_invalid(
    vllm: VllmServer, sidecar: SidecarFactory
) -> None:
    """Streamed and whole json_object answers: /metrics valid/invalid equal the client's."""
    sc = sidecar(vllm.url, traces=False)
    client = openai.OpenAI(base_url=sc.url + "/v1", api_key="unused", max_retries=0)
    cut_off = _one_token_objects(vllm)
    verdicts = []
    for max_tokens in (1, 4, 12, 24):
        bias = cut_off if max_tokens == 1 else None
        stream = client.chat.completions.create(
            model="tiny", messages=ASK, max_tokens=max_tokens, stream=True,
            response_format=JSON_MODE, logit_bias=bias,
        )  # fmt: skip
        text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
        verdicts.append(_parses(text))
        whole = client.chat.completions.create(
            model="tiny", messages=ASK, max_tokens=max_tokens,
            response_format=JSON_MODE, logit_bias=bias,
        )  # fmt: skip
        verdicts.append(_parses(whole.choices[0].message.content or ""))
    client.chat.completions.create(model="tiny", messages=ASK, max_tokens=4)  # not counted

    events = sc.wait_events(9)
    judged = [e["json_valid"] for e in events if e["json_valid"] is not None]
    assert sorted(judged) == sorted(verdicts)
    counted = {
        result: probes.metric(
            sc.url, c.JSON_ANSWERS.series[0], lane="default", model="tiny", result=result
        )
        for result in (c.JSON_VALID, c.JSON_INVALID)
    }
    assert counted == {
        c.JSON_VALID: float(verdicts.count(True)),
        c.JSON_INVALID: float(verdicts.count(False)),
    }
    assert verdicts[:2] == [False, False]  # one token, no one-token object: cut off
