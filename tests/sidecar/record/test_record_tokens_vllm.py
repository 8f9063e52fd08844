"""Every token vLLM made is counted, and a client's mistake is the client's (real vLLM).

The prompt ``“`` makes the tiny model's greedy tokens decode to no text (parts of a
multi-byte character): vLLM sends each as a frame with ``"content":""``. The events'
completion tokens are compared with vLLM's own ``vllm:generation_tokens_total``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import Any

import httpx
import openai
import pytest

from obs import conventions as c
from obs.engines.server import VllmServer
from obs.sidecar.testing import SidecarProcess
from tests.conftest import SidecarFactory
from tests.support.engine_core import Throttle, engine_core_throttled
from tests.support.probes import metric, wait_for
from tests.support.tcp import closed_both_ways, server_side

pytestmark = pytest.mark.engine

EMPTY_TEXT: Any = [{"role": "user", "content": "\u201c"}]  # greedy tokens with no text
GENERATED = "vllm:generation_tokens_total"
# Nearly the shared engine's whole context (2048): the engine must still be decoding when
# the test freezes it.
MANY = 2000
READ_WAIT_S = 10.0  # a read's wait for a token the engine made (a starved machine's too)


def client_of(sc: SidecarProcess, timeout_s: float = 60) -> openai.OpenAI:
    return openai.OpenAI(base_url=sc.url + "/v1", api_key="x", max_retries=0, timeout=timeout_s)


def idle_generated(vllm: VllmServer) -> float:
    """vLLM's generated-token counter once it runs no request (aborts take effect)."""
    wait_for("vLLM to run no request", lambda: metric(vllm.url, "vllm:num_requests_running") == 0)
    return metric(vllm.url, GENERATED)


def tokens_read(chunk: Any) -> int:
    """The tokens a chunk brought the client: its logprobs entries, else 1 per token chunk."""
    n = 0
    for choice in chunk.choices:
        if choice.delta.role:  # the role chunk: no token
            continue
        listed = choice.logprobs.content if choice.logprobs else None
        n += len(listed) if listed else 1
    return n


def read_tokens(
    chunks: Iterable[Any], stop_at: int | None = None, throttle: Throttle | None = None
) -> int:
    """Tokens read from ``chunks`` (until ``stop_at`` of them, or a read timeout); each read
    lets ``throttle``'s engine run one more slice."""
    n = 0
    try:
        for ch in chunks:
            n += tokens_read(ch)
            if throttle is not None:
                throttle.read()
            if stop_at is not None and n >= stop_at:
                break
    except openai.APITimeoutError:
        pass  # the frozen engine makes no more: every token made before has been read
    return n


def test_empty_text_tokens_are_tokens_and_the_first_ends_ttft(
    vllm: VllmServer, sidecar: SidecarFactory
) -> None:
    """Frames of empty text are counted, and TTFT ends at the first of them, not at text."""
    sc = sidecar(vllm.url, traces=False)
    before = idle_generated(vllm)
    rid = uuid.uuid4().hex
    t0 = time.perf_counter()
    chunks = client_of(sc).chat.completions.create(
        model="tiny", messages=EMPTY_TEXT, max_tokens=24, temperature=0, stream=True,
        extra_headers={"X-Request-Id": rid},
    )  # fmt: skip
    first_token_ms, token_chunks, empty = 0.0, 0, 0
    for ch in chunks:
        if tokens_read(ch):
            token_chunks += 1
            first_token_ms = first_token_ms or (time.perf_counter() - t0) * 1000
            empty += not ch.choices[0].delta.content
    ev = sc.events_of(rid)[0]
    assert idle_generated(vllm) - before == 24 == ev["completion_tokens"]
    # Half the frames or more had no text (under load vLLM merges some tokens into one frame).
    assert ev["output_chunks"] == token_chunks and empty >= token_chunks // 2
    # The client's clock spans the sidecar's: its first token frame cannot reach the
    # client before the sidecar sent it (a TTFT at the first text would come later).
    assert ev["ttft_ms"] <= first_token_ms


@pytest.mark.parametrize("listed", [False, True], ids=["plain", "logprobs"])
def test_cancelled_empty_text_streams_count_the_tokens_made(
    vllm: VllmServer, sidecar: SidecarFactory, listed: bool
) -> None:
    """A cancel mid-stream: the event counts every token frame read, empty text included;
    with frames that list their tokens, exactly the tokens vLLM's counter says it made.

    The engine core is frozen before the cancel, so no token is made after the client's
    last read: what is judged holds however fast the engine ran. Plain frames can each carry
    several tokens when vLLM's API server fell behind its engine (it merges them): then vLLM
    made more than the frames show.
    """
    sc = sidecar(vllm.url, traces=False)
    extra: dict[str, Any] = {"ignore_eos": True, **({"logprobs": True} if listed else {})}
    before = idle_generated(vllm)
    rid = uuid.uuid4().hex
    # The engine runs in slices, in step with the client, until the client has read 10
    # tokens; then it stops. A read waits up to READ_WAIT_S for what the engine made (the
    # last one, after the freeze, ends the reading: nothing more can come).
    with client_of(sc, timeout_s=READ_WAIT_S) as client, engine_core_throttled(vllm) as throttle:
        chunks = client.chat.completions.create(
            model="tiny", messages=EMPTY_TEXT, max_tokens=MANY, temperature=0, stream=True,
            extra_body=extra, extra_headers={"X-Request-Id": rid},
        )  # fmt: skip
        read = read_tokens(chunks, stop_at=10, throttle=throttle)
        assert read >= 10, f"the client read {read} tokens, then nothing for {READ_WAIT_S} s"
        throttle.freeze()
        streams = {p for p, state in server_side(vllm.port).items() if state == "ESTABLISHED"}
        read += read_tokens(chunks)  # what was made before the freeze, then a read timeout
        chunks.close()
        ev = sc.events_of(rid)[0]
        # The sidecar closed vLLM's connection before it wrote the event; vLLM's API server
        # (not frozen) closes its side as it sees that, and aborts the request, before the
        # engine resumes (tests.support.tcp).
        wait_for(
            "vLLM to see the sidecar close the stream's connection",
            lambda: closed_both_ways(vllm.port, streams),
            30,
            0.05,
        )
    made = idle_generated(vllm) - before
    assert (ev["status"], ev["tokens_source"]) == (c.DISCONNECTED, c.TOKENS_COUNTED)
    assert ev["completion_tokens"] == read >= 10
    if listed:
        assert ev["completion_tokens"] == made
    else:
        assert ev["completion_tokens"] <= made


@pytest.mark.parametrize("listed", [False, True], ids=["plain", "logprobs"])
def test_three_choices_count_every_token_frame(
    vllm: VllmServer, sidecar: SidecarFactory, listed: bool
) -> None:
    """n=3 (no usage asked, so tokens are counted): each choice's empty-text frames count;
    with listed tokens the count is vLLM's exactly (plain frames may carry merged tokens)."""
    sc = sidecar(vllm.url, traces=False)
    before = idle_generated(vllm)
    rid = uuid.uuid4().hex
    extra: dict[str, Any] = {"ignore_eos": True, **({"logprobs": True} if listed else {})}
    chunks = client_of(sc).chat.completions.create(
        model="tiny", messages=EMPTY_TEXT, max_tokens=12, temperature=0.01, seed=3, n=3,
        stream=True, extra_body=extra, extra_headers={"X-Request-Id": rid},
    )  # fmt: skip
    read = read_tokens(chunks)
    ev = sc.events_of(rid)[0]
    assert idle_generated(vllm) - before == 36
    assert (ev["status"], ev["usage_injected"], ev["tokens_source"]) == (
        c.OK,
        False,
        c.TOKENS_COUNTED,
    )
    assert ev["completion_tokens"] == read <= 36
    if listed:
        assert read == 36


def test_streamed_request_vllm_refuses_in_the_stream_is_a_client_error(
    vllm: VllmServer, sidecar: SidecarFactory
) -> None:
    """top_logprobs over vLLM's limit: an error frame with code 400, the client's mistake."""
    sc = sidecar(vllm.url, traces=False)
    rid = uuid.uuid4().hex
    chunks = client_of(sc).chat.completions.create(
        model="tiny", messages=EMPTY_TEXT, max_tokens=4, stream=True, logprobs=True,
        top_logprobs=100, extra_headers={"X-Request-Id": rid},
    )  # fmt: skip
    with pytest.raises(openai.APIError, match="logprobs"):
        for _ in chunks:
            pass
    ev = sc.events_of(rid)[0]
    assert (ev["status"], ev["error_class"], ev["http_status"]) == (
        c.CLIENT_ERROR,
        "upstream_stream_error",
        200,
    )
    assert metric(sc.url, c.REQUESTS.series[0], outcome=c.CLIENT_ERROR) == 1
    assert metric(sc.url, c.REQUESTS.series[0], outcome=c.ERROR) == 0
    assert metric(sc.url, c.UPSTREAM_ERRORS.series[0]) == 0


def test_error_body_to_a_stream_asked_usage_for_keeps_its_length(
    vllm: VllmServer, sidecar: SidecarFactory
) -> None:
    """vLLM's 404 JSON to a stream the sidecar asked usage for: Content-Length, as direct."""
    sc = sidecar(vllm.url, traces=False)
    body = {"model": "nope", "messages": EMPTY_TEXT, "stream": True}
    direct = httpx.post(vllm.url + "/v1/chat/completions", json=body, timeout=30)
    relayed = httpx.post(sc.url + "/v1/chat/completions", json=body, timeout=30)
    assert (relayed.status_code, relayed.content) == (direct.status_code, direct.content)
    assert direct.status_code == 404
    for r in (direct, relayed):
        assert r.headers["content-length"] == str(len(r.content))
        assert "transfer-encoding" not in r.headers
    (ev,) = sc.wait_events(1)
    assert ev["usage_injected"] is True
