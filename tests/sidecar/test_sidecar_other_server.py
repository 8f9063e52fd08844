"""The sidecar app under an ASGI server other than its own (uvicorn's h11 protocol).

``vllm-obs sidecar`` writes each token straight to the client's connection
(obs.sidecar.server.client); under any other server that connection is not exposed and
the relay sends each piece as an ASGI message instead. This pins that path.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import orjson
import pytest

from obs.engines.server import VllmServer
from obs.procs import free_port, wait_http

pytestmark = pytest.mark.engine

SERVE = """
import sys
from pathlib import Path
import uvicorn
from obs.config import single_upstream
from obs.sidecar.app import create_app
from obs.sidecar.settings import Settings

upstream, port, events = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
settings = Settings(config=single_upstream(upstream), port=port, events_path=events)
uvicorn.run(create_app(settings), host="127.0.0.1", port=port, http="h11", log_level="warning")
"""


@pytest.fixture
def h11_sidecar(vllm: VllmServer, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    port = free_port()
    events = tmp_path / "events.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, vllm.url, str(port), str(events)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", 30, proc)
        yield url, events
    finally:
        proc.terminate()
        proc.wait(30)


def test_stream_under_another_asgi_server_is_relayed_and_recorded(
    h11_sidecar: tuple[str, Path],
) -> None:
    """Under plain uvicorn (h11): the stream arrives token by token, whole, and is recorded."""
    url, events = h11_sidecar
    client = openai.OpenAI(base_url=url + "/v1", api_key="none")
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "count"}],
        max_tokens=16,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = [ch for ch in stream if ch.choices and ch.choices[0].delta.content]
    assert len(chunks) >= 8, "the stream did not arrive as tokens"
    lines: list[dict[str, object]] = []
    for _ in range(100):
        if events.exists():
            lines = [orjson.loads(x) for x in events.read_bytes().splitlines() if x]
        if lines:
            break
        time.sleep(0.1)
    assert len(lines) == 1
    ev = lines[0]
    assert ev["status"] == "ok", ev
    assert ev["completion_tokens"] == 16
    assert isinstance(ev["ttft_ms"], float) and ev["ttft_ms"] > 0
