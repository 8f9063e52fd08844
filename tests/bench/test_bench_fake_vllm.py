"""The benchmark's fake vLLM writes exactly what a real vLLM 0.32 wrote (tests/data captures)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.procs import FAKE_VLLM, ROOT
from obs.procs import free_port, wait_http

CAPTURE = Path(__file__).resolve().parents[1] / "data" / "vllm-0.32-sse-capture.txt"
# What differs between two runs of vLLM itself: ids, timestamps, the build hash, generated
# text and the tokenizer's prompt count.
_VOLATILE = [
    (rb'"id":"(chatcmpl|cmpl)-[0-9a-z]+"', rb'"id":"\1-ID"'),
    (rb'"created":\d+', rb'"created":0'),
    (rb'"system_fingerprint":"vllm-0\.32\.0-[0-9a-f]+"', rb'"system_fingerprint":"FP"'),
    (rb'"(content|text)":"(?:[^"\\]|\\.)+"', rb'"\1":"TEXT"'),
    (rb'"(prompt_tokens|total_tokens)":\d+', rb'"\1":0'),
]


def _normalise(data: bytes) -> bytes:
    for pattern, repl in _VOLATILE:
        data = re.sub(pattern, repl, data)
    return data


def _sections() -> dict[str, bytes]:
    parts = re.split(rb"^### (.+)\n", CAPTURE.read_bytes(), flags=re.M)
    return {parts[i].decode(): parts[i + 1].rstrip(b"\n") for i in range(1, len(parts) - 1, 2)}


@pytest.fixture(scope="module")
def fake() -> Iterator[int]:
    """The fake on a free loopback port, no pacing; stopped by PID."""
    port = free_port()
    cmd = [sys.executable, *FAKE_VLLM, "--port", str(port), "--ttft-ms", "0", "--itl-ms", "0"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 20, proc)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def _exchange(port: int, path: str, body: dict[str, object]) -> tuple[bytes, list[bytes]]:
    """Raw HTTP/1.1 POST; returns the response head and the body's chunks (or whole body)."""
    payload = json.dumps(body).encode()
    req = (
        f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload)}\r\nconnection: close\r\n\r\n"
    ).encode() + payload
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(req)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    if b"transfer-encoding: chunked" not in head:
        return head, [rest]
    chunks: list[bytes] = []
    while True:
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            return head, chunks
        chunks.append(rest[:size])
        assert rest[size : size + 2] == b"\r\n"
        rest = rest[size + 2 :]


def _request(kind: str, stream: bool, usage: bool) -> tuple[str, dict[str, object]]:
    body: dict[str, object] = {"model": "tiny", "max_tokens": 3, "stream": stream}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": "Say something about Python."}]
    else:
        body["prompt"] = "hi"
    if usage:
        body["stream_options"] = {"include_usage": True}
    return ("/v1/chat/completions" if kind == "chat" else "/v1/completions"), body


@pytest.mark.process
@pytest.mark.parametrize("kind", ["chat", "completions"])
@pytest.mark.parametrize("usage", [False, True])
def test_stream_is_vllms_frames_one_chunk_each(fake: int, kind: str, usage: bool) -> None:
    """Streamed answers have vLLM's frames, keys and order, each frame its own HTTP chunk."""
    path, body = _request(kind, True, usage)
    head, chunks = _exchange(fake, path, body)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"\r\ncontent-type: text/event-stream; charset=utf-8\r\n" in head
    assert all(c.endswith(b"\n\n") and c.count(b"\n\n") == 1 for c in chunks)
    section = f"{kind}, stream, {'include_usage' if usage else 'no include_usage'}"
    assert _normalise(b"".join(chunks)).rstrip(b"\n") == _normalise(_sections()[section])


@pytest.mark.process
@pytest.mark.parametrize("kind", ["chat", "completions"])
def test_whole_answer_is_vllms_json(fake: int, kind: str) -> None:
    """Non-streamed answers have vLLM's JSON body, key for key, with a content-length."""
    path, body = _request(kind, False, False)
    head, (data,) = _exchange(fake, path, body)
    assert f"\r\ncontent-length: {len(data)}\r\n".encode() in head
    assert _normalise(data) == _normalise(_sections()[f"{kind}, non-stream"])


@pytest.mark.process
def test_unknown_model_is_vllms_404(fake: int) -> None:
    """An unknown model gets vLLM's NotFoundError body, byte for byte."""
    path, body = _request("chat", False, False)
    head, (data,) = _exchange(fake, path, {**body, "model": "nope"})
    assert head.startswith(b"HTTP/1.1 404 Not Found\r\n")
    assert data == _sections()["error: unknown model"]


@pytest.mark.process
def test_every_request_gets_max_tokens_paced(fake: int) -> None:
    """A request gets exactly max_tokens tokens; fake_ttft_ms/fake_itl_ms pace them."""
    path, body = _request("completions", True, True)
    t0 = time.perf_counter()
    _, chunks = _exchange(
        fake, path, {**body, "max_tokens": 7, "fake_ttft_ms": 30, "fake_itl_ms": 10}
    )
    elapsed = time.perf_counter() - t0
    usage = json.loads(chunks[-2][len(b"data: ") :])["usage"]
    assert usage["completion_tokens"] == 7 and len(chunks) == 7 + 2
    assert elapsed >= 0.03 + 6 * 0.01
