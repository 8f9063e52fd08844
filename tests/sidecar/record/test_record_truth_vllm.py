"""The record tells the truth with a real ``vllm serve`` and the official ``openai`` client.

Each test pins one case where the record once said something that did not happen:
a stream the client read whole recorded as a disconnect, a cancel with no token
counts, a streamed error reply given a TTFT, multi-choice streams and
``continuous_usage_stats`` changed by the usage the sidecar asks for, and the
sidecar's own 400 for malformed JSON in place of vLLM's.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
import openai
import orjson
import pytest

from obs import conventions as c
from obs.engines.server import VllmServer
from obs.sidecar.testing import SidecarProcess
from tests.conftest import SidecarFactory
from tests.support.engine_core import engine_core_throttled
from tests.support.probes import frame_json, metric, sse_frames

pytestmark = pytest.mark.engine

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
_CREATED = re.compile(rb'"created":\d+')
MSGS: Any = [{"role": "user", "content": "def fibonacci(n):"}]


def events_by_id(sc: SidecarProcess, n: int) -> dict[str, dict[str, Any]]:
    return {ev["request_id"]: ev for ev in sc.wait_events(n, timeout_s=30)}


def raw(base: str, route: str, body: Any, rid: str, **kw: Any) -> tuple[int, bytes]:
    r = httpx.post(base + route, headers={"X-Request-Id": rid}, timeout=60, **kw, json=body)
    return r.status_code, _CREATED.sub(b'"created":0', r.content)


def by_choice(body: bytes) -> dict[int, list[bytes]]:
    """A stream's frames by choice index, in order (-1: frames without a choice)."""
    out: dict[int, list[bytes]] = {}
    for fr in sse_frames(body):
        try:
            choices = frame_json(fr).get("choices") or [{"index": -1}]
        except (ValueError, orjson.JSONDecodeError):
            choices = [{"index": -1}]
        out.setdefault(choices[0]["index"], []).append(fr)
    return out


def test_openai_sdk_streams_read_whole_are_ok(vllm: VllmServer, sidecar: SidecarFactory) -> None:
    """Streams the SDK read to [DONE] (then closed) are ok, one and two choices alike."""
    sc = sidecar(vllm.url, traces=False)
    client = openai.OpenAI(base_url=sc.url + "/v1", api_key="x", max_retries=0)
    n_req = 40
    for i in range(n_req):
        chunks = client.chat.completions.create(
            model="tiny", messages=MSGS, max_tokens=8, stream=True, n=1 + i % 2, temperature=1
        )
        assert sum(1 for _ in chunks) > 0
    events = sc.wait_events(n_req, timeout_s=30)
    assert [ev["status"] for ev in events] == [c.OK] * n_req
    assert all(ev["error_class"] is None for ev in events)


def test_cancelled_stream_records_the_tokens_relayed(
    vllm: VllmServer, sidecar: SidecarFactory
) -> None:
    """A client that cancels mid-stream leaves counted output tokens, not null usage. The
    engine runs in step with the client and is frozen when it cancels (tests.support.
    engine_core), so the cancel comes mid-stream however fast the engine ran."""
    sc = sidecar(vllm.url, traces=False)
    rid = uuid.uuid4().hex
    with (
        openai.OpenAI(base_url=sc.url + "/v1", api_key="x", max_retries=0, timeout=60) as client,
        engine_core_throttled(vllm) as throttle,
    ):
        chunks = client.chat.completions.create(
            model="tiny",
            messages=MSGS,
            max_tokens=1500,
            stream=True,
            extra_body={"ignore_eos": True},
            extra_headers={"X-Request-Id": rid},
        )
        read = 0
        for ch in chunks:
            throttle.read()  # one more slice of the engine per read: it never runs ahead
            # Every token frame counts, text or not: the tiny model samples tokens that add no
            # text yet (a cut multi-byte character), which the record counts as tokens too.
            read += 1 if ch.choices and ch.choices[0].delta.role is None else 0
            if read == 20:
                break
        throttle.freeze()
        chunks.close()
        (ev,) = sc.events_of(rid, timeout_s=30)
    assert ev["status"] == c.DISCONNECTED
    assert ev["tokens_source"] == c.TOKENS_COUNTED
    assert ev["completion_tokens"] == ev["output_chunks"] >= 20
    assert ev["prompt_tokens"] is None  # vLLM reports it only in the usage it never sent


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"model": "nope", "messages": MSGS}, 404),
        ({"model": "tiny", "messages": [{"role": "user", "content": "x " * 3000}]}, 400),
    ],
)
def test_streamed_error_reply_has_no_ttft(
    vllm: VllmServer, sidecar: SidecarFactory, body: dict[str, Any], status: int
) -> None:
    """vLLM's JSON error to a streamed request: no TTFT, TPOT or output, no TTFT sample."""
    sc = sidecar(vllm.url, traces=False)
    rid = uuid.uuid4().hex
    before = metric(sc.url, c.TTFT.series[2])
    got, _ = raw(sc.url, CHAT, {**body, "stream": True}, rid)
    assert got == status
    ev = events_by_id(sc, 1)[rid]
    assert ev["status"] == c.CLIENT_ERROR
    assert (ev["ttft_ms"], ev["tpot_ms"], ev["output_chunks"]) == (None, None, 0)
    assert metric(sc.url, c.TTFT.series[2]) == before


@pytest.mark.parametrize(
    ("route", "extra"),
    [
        (CHAT, {"messages": MSGS, "n": 2, "temperature": 1, "seed": 7}),
        (COMPLETIONS, {"prompt": ["import os\n", "def main():"]}),
        (CHAT, {"messages": MSGS, "stream_options": {"continuous_usage_stats": True}}),
        (
            CHAT,
            {
                "messages": MSGS,
                "stream_options": {"include_usage": False, "continuous_usage_stats": True},
            },
        ),
    ],
)
def test_usage_the_sidecar_needs_changes_no_frame(
    vllm: VllmServer, sidecar: SidecarFactory, route: str, extra: dict[str, Any]
) -> None:
    """Multi-choice and continuous-usage streams reach the client exactly as vLLM sent them."""
    sc = sidecar(vllm.url, traces=False)
    body = {"model": "tiny", "max_tokens": 6, "temperature": 0, "stream": True, **extra}
    rid = uuid.uuid4().hex
    direct = raw(vllm.url, route, body, rid)
    relayed = raw(sc.url, route, body, rid)
    assert relayed[0] == direct[0] == 200
    # Every frame byte for byte, in order per choice (vLLM may interleave choices differently
    # from one run to the next when their prompts differ).
    assert by_choice(relayed[1]) == by_choice(direct[1])
    assert direct[1].count(b'"system_fingerprint"') >= (2 if "n" in extra else 1)
    ev = events_by_id(sc, 1)[rid]
    assert ev["status"] == c.OK and ev["completion_tokens"] >= 6


def test_openai_sdk_sees_a_fingerprint_on_every_choice(
    vllm: VllmServer, sidecar: SidecarFactory
) -> None:
    """With n=2 and no usage asked, each choice's last chunk carries system_fingerprint."""
    sc = sidecar(vllm.url, traces=False)
    client = openai.OpenAI(base_url=sc.url + "/v1", api_key="x", max_retries=0)
    chunks = client.chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=5, temperature=1, seed=7, stream=True, n=2
    )
    last = {ch.choices[0].index: ch for ch in chunks if ch.choices and ch.choices[0].finish_reason}
    assert sorted(last) == [0, 1]
    assert all(ch.system_fingerprint for ch in last.values())
    (ev,) = sc.wait_events(1)
    assert (ev["usage_injected"], ev["tokens_source"]) == (False, c.TOKENS_COUNTED)
    assert ev["completion_tokens"] == 10


def test_malformed_json_gets_vllms_own_answer(vllm: VllmServer, sidecar: SidecarFactory) -> None:
    """A body that is not JSON is vLLM's to refuse: the client gets vLLM's exact 400."""
    sc = sidecar(vllm.url, traces=False)
    rid = uuid.uuid4().hex
    bad = b'{"model": "tiny", messages'
    headers = {"X-Request-Id": rid, "content-type": "application/json"}
    direct = httpx.post(vllm.url + CHAT, headers=headers, timeout=30, content=bad)
    relayed = httpx.post(sc.url + CHAT, headers=headers, timeout=30, content=bad)
    assert (relayed.status_code, relayed.content) == (direct.status_code, direct.content)
    assert direct.status_code == 400
    ev = events_by_id(sc, 1)[rid]
    assert (ev["status"], ev["error_class"], ev["http_status"]) == (
        c.CLIENT_ERROR,
        "upstream_status",
        400,
    )


def test_made_up_request_ids_keep_vllms_response_id_form(
    vllm: VllmServer, sidecar: SidecarFactory
) -> None:
    """Without X-Request-Id the response id looks like vLLM's own: chatcmpl-<16 hex>."""
    sc = sidecar(vllm.url, traces=False)
    client = openai.OpenAI(base_url=sc.url + "/v1", api_key="x", max_retries=0)
    resp = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2)
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", resp.id)
    (ev,) = sc.wait_events(1)
    assert resp.id == f"chatcmpl-{ev['request_id']}"
