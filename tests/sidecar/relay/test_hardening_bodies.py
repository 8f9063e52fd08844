"""Bodies one JSON parser refuses and another accepts, and fields with loose types (issue 25).

vLLM reads a request with Starlette's ``json.loads`` (NaN, Infinity, 1e400, a lone
surrogate) and pydantic's lax types ("100000", 100000.0, ``"stream": 1``), and a chat's
``max_completion_tokens`` before its ``max_tokens``: the sidecar must classify and admit
the request as vLLM will serve it. A real sidecar process; the pool is ``ScriptedUpstream``,
a plain HTTP server that keeps every body it is sent, because no real vLLM reports the
bytes it received.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from obs import conventions as c
from obs.sidecar.testing import SidecarProcess
from tests.support import chat_body, event_of
from tests.support.scripted_upstream import ScriptedUpstream

pytestmark = pytest.mark.process

CHAT = "/v1/chat/completions"
LONG_PROMPT = "word " * 200  # about 250 tokens by the sidecar's estimate: over lane a's 100


@pytest.fixture(scope="module")
def pool() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as up:
        yield up


@pytest.fixture(scope="module")
def guarded(
    pool: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SidecarProcess]:
    """Lane ``s`` (streams): prompts up to 5 tokens; lane ``a``: 100 tokens, budget 600."""
    tmp: Path = tmp_path_factory.mktemp("bodies")
    config = {
        "version": 1,
        "pools": [{"name": "p", "replicas": [pool.url], "model": "tiny"}],
        "lanes": [
            {"name": "s", "pool": "p", "match": [{"stream": True}],
             "admission": {"max_prompt_tokens": 5}},
            {"name": "a", "pool": "p",
             "admission": {"max_prompt_tokens": 100, "token_budget": 600}},
        ],
        "default_lane": "a",
    }  # fmt: skip
    path = tmp / "lanes.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    env = {"OTEL_TRACES_EXPORTER": "none"}
    with SidecarProcess(
        config=path, events=tmp / "events.jsonl", env=env, log_path=tmp / "sidecar.log"
    ) as sc:
        yield sc


def _post(sc: SidecarProcess, raw: bytes) -> tuple[httpx.Response, str]:
    rid = uuid.uuid4().hex[:16]
    headers = {"content-type": "application/json", "x-request-id": rid}
    return httpx.post(sc.url + CHAT, content=raw, headers=headers, timeout=30), rid


def _reason(r: httpx.Response) -> str:
    return str(r.json()["error"]["message"])


@pytest.mark.parametrize(
    "pad", ["NaN", "Infinity", "-Infinity", "1e400", '"\\ud800"', "123456789012345678901234567890"]
)
def test_a_body_only_pythons_json_reads_is_classified_not_waved_through(
    guarded: SidecarProcess, pool: ScriptedUpstream, pad: str
) -> None:
    """A long prompt padded with ``"pad": NaN`` (or the like) is refused 413 as vLLM reads it."""
    body = json.dumps(chat_body(LONG_PROMPT))[:-1] + f', "pad": {pad}}}'
    before = len(pool.received)
    r, rid = _post(guarded, body.encode())
    assert r.status_code == 413, r.text
    assert c.PROMPT_TOO_LONG in r.text or "prompt" in _reason(r)
    assert len(pool.received) == before
    ev = event_of(guarded, rid)
    assert ev["model"] == "tiny"
    assert ev["rejection_reason"] == c.PROMPT_TOO_LONG


@pytest.mark.parametrize(
    ("fields", "recorded"),
    [
        ({"max_tokens": 1, "max_completion_tokens": 100000}, 100000),
        ({"max_tokens": "100000"}, 100000),
        ({"max_tokens": 100000.0}, 100000),
        ({"max_completion_tokens": "100000", "max_tokens": None}, 100000),
        ({"max_completion_tokens": 2**64}, 2**31 - 1),  # the event holds 32 bits
    ],
)
def test_max_tokens_is_read_with_vllms_precedence_and_loose_types(
    guarded: SidecarProcess, pool: ScriptedUpstream, fields: dict[str, object], recorded: int
) -> None:
    """max_completion_tokens before max_tokens, "100000" and 100000.0 as 100000: over budget."""
    body = {**chat_body(), **fields}
    before = len(pool.received)
    r, rid = _post(guarded, json.dumps(body).encode())
    assert r.status_code == 413, r.text
    assert len(pool.received) == before
    ev = event_of(guarded, rid)
    assert ev["rejection_reason"] == c.OVER_TOKEN_BUDGET
    assert ev["max_tokens"] == recorded


def test_stream_1_follows_the_stream_rules(guarded: SidecarProcess, pool: ScriptedUpstream) -> None:
    """``"stream": 1`` is a stream to vLLM: lane ``s`` and its 5-token prompt cap apply."""
    r, rid = _post(
        guarded, json.dumps(chat_body("a prompt of forty characters or so", stream=1)).encode()
    )
    assert r.status_code == 413, r.text
    ev = event_of(guarded, rid)
    assert (ev["lane"], ev["stream"]) == ("s", True)


@pytest.mark.parametrize(
    ("fields", "named"),
    [({"max_tokens": 1.5}, "max_tokens"), ({"model": 5}, "model"), ({"stream": "maybe"}, "stream"),
     ({"max_completion_tokens": [1]}, "max_completion_tokens")],
)  # fmt: skip
def test_a_field_vllm_refuses_is_refused_with_400_naming_it(
    guarded: SidecarProcess, pool: ScriptedUpstream, fields: dict[str, object], named: str
) -> None:
    """A value pydantic's lax mode refuses gets 400 naming the field, before any pool."""
    before = len(pool.received)
    r, _ = _post(guarded, json.dumps({**chat_body(), **fields}).encode())
    assert r.status_code == 400, r.text
    assert _reason(r).startswith(f"invalid request field {named}:")
    assert len(pool.received) == before


def test_a_nan_body_reaches_the_pool_as_vllm_would_read_it(
    guarded: SidecarProcess, pool: ScriptedUpstream
) -> None:
    """A short NaN-padded request passes, its event names the model, NaN and the surrogate
    reach the pool unchanged when the sidecar adds ``stream_options``."""
    body = json.dumps(chat_body("hi", stream=True))[:-1] + ', "pad": NaN, "who": "\\ud800"}'
    guarded_short = body.replace('"hi"', '"h"')
    r, rid = _post(guarded, guarded_short.encode())
    assert r.status_code == 200, r.text
    sent = json.loads(pool.received[-1][1])
    assert sent["pad"] != sent["pad"]  # NaN
    assert sent["who"] == "\ud800"
    assert sent["stream_options"]["include_usage"] is True
    assert event_of(guarded, rid)["model"] == "tiny"


def test_a_body_without_a_model_records_the_model_the_pool_serves(
    guarded: SidecarProcess,
) -> None:
    """vLLM serves a request that names no model with its own: the event names that model."""
    body = chat_body()
    del body["model"]
    r, rid = _post(guarded, json.dumps(body).encode())
    assert r.status_code == 200, r.text
    assert event_of(guarded, rid)["model"] == "tiny"
