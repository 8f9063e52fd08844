"""The second fake pool (bench/fake_openai.py) streams what an OpenAI-compatible server does:
the asked number of tokens, a usage frame when asked, [DONE]; spaced JSON throughout."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest

from bench.procs import FAKE_POOLS, ROOT
from obs.procs import free_port, wait_http

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def pool() -> Iterator[str]:
    """The fake on a free loopback port, no pacing; stopped by PID."""
    port = free_port()
    cmd = [sys.executable, "-m", FAKE_POOLS["fake_openai"], "--port", str(port)]
    cmd += ["--ttft-ms", "0", "--itl-ms", "0"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 20, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def _post(url: str, body: dict[str, object]) -> bytes:
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return bytes(resp.read())


def test_a_stream_has_the_asked_tokens_usage_and_done(pool: str) -> None:
    """A streamed chat with include_usage: a role frame, three content frames (the last with
    finish_reason "length"), a usage frame counting three tokens, then [DONE]; spaced JSON."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_completion_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    frames = [f for f in _post(pool, body).split(b"\n\n") if f]
    assert frames[-1] == b"data: [DONE]" and frames[0].startswith(b'data: {"id": "chatcmpl-')
    chunks = [json.loads(f[6:]) for f in frames[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    content = [c["choices"][0] for c in chunks[1:4]]
    assert [c["finish_reason"] for c in content] == [None, None, "length"]
    assert all(c["delta"]["content"] for c in content)
    assert chunks[4]["choices"] == [] and chunks[4]["usage"]["completion_tokens"] == 3


def test_a_whole_answer_and_an_unknown_model(pool: str) -> None:
    """Not streamed: one chat.completion with usage; another model's name: a 404 error body."""
    answer = json.loads(_post(pool, {"model": "tiny", "messages": [], "max_tokens": 4}))
    assert answer["object"] == "chat.completion" and answer["usage"]["completion_tokens"] == 4
    with pytest.raises(urllib.error.HTTPError) as err:
        _post(pool, {"model": "other", "messages": []})
    err.value.close()
    assert err.value.code == 404
