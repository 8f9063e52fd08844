"""The local engine: environment setup, tiny model, and a real ``vllm serve`` by PID."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from obs.engines.server import ServerError, VllmServer
from obs.engines.setup import EnginePaths, build_tiny_model, engine_home, ensure_engine
from obs.procs import group_alive, port_in_use

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get_json(url: str) -> Any:
    with _NO_PROXY.open(url, timeout=30) as response:
        return json.load(response)


def _post(url: str, body: dict[str, Any]) -> tuple[str, bytes]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with _NO_PROXY.open(request, timeout=60) as response:
        return response.headers.get_content_type(), response.read()


def _digests(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file() and not p.name.startswith(".")
    }


@pytest.mark.engine
def test_ensure_engine_is_a_no_op_once_done(engine_paths: EnginePaths) -> None:
    """A second ensure_engine() installs and builds nothing and returns the same paths."""
    messages: list[str] = []

    again = ensure_engine(progress=messages.append)

    assert again == engine_paths
    assert messages and all("ready" in m for m in messages)


@pytest.mark.engine
def test_tiny_model_build_is_deterministic(engine_paths: EnginePaths, tmp_path: Path) -> None:
    """Building the tiny model again with the same seed gives byte-identical files."""
    build_tiny_model(engine_paths.python, tmp_path / "again")

    first, again = _digests(engine_paths.model_dir), _digests(tmp_path / "again")
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= first.keys()
    assert any(name.endswith(".safetensors") for name in first)
    assert again == first


@pytest.mark.engine
def test_tiny_model_has_the_agreed_shape(engine_paths: EnginePaths) -> None:
    """The tiny model is a 2-layer Llama with a 4096-token vocab and a chatml template."""
    config = json.loads((engine_paths.model_dir / "config.json").read_text())
    tokenizer = json.loads((engine_paths.model_dir / "tokenizer_config.json").read_text())
    template = tokenizer.get("chat_template") or (
        (engine_paths.model_dir / "chat_template.jinja").read_text()
    )

    assert config["model_type"] == "llama"
    assert (config["vocab_size"], config["num_hidden_layers"], config["hidden_size"]) == (
        4096,
        2,
        256,
    )
    assert config["tie_word_embeddings"] is True
    assert tokenizer["eos_token"] == "<|im_end|>"
    assert "<|im_start|>" in template


@pytest.mark.engine
def test_server_lists_the_served_model_name(vllm: VllmServer) -> None:
    """/v1/models of a started server lists exactly the served name "tiny"."""
    models = _get_json(f"{vllm.url}/v1/models")

    assert [m["id"] for m in models["data"]] == ["tiny"]


@pytest.mark.engine
def test_server_answers_a_chat_completion(vllm: VllmServer) -> None:
    """A non-streaming chat completion returns an assistant message and token usage."""
    content_type, raw = _post(
        f"{vllm.url}/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
    )
    body = json.loads(raw)

    assert content_type == "application/json"
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert 1 <= body["usage"]["completion_tokens"] <= 8
    assert body["usage"]["prompt_tokens"] > 0


@pytest.mark.engine
def test_server_streams_server_sent_events(vllm: VllmServer) -> None:
    """A streamed chat completion is SSE: data lines, a usage chunk, then [DONE]."""
    content_type, raw = _post(
        f"{vllm.url}/v1/chat/completions",
        {
            "model": "tiny",
            "messages": [{"role": "user", "content": "count"}],
            "max_tokens": 16,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    events = [block for block in raw.decode().split("\n\n") if block]
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]

    assert content_type == "text/event-stream"
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 16
    assert "cached_tokens" in chunks[-1]["usage"]["prompt_tokens_details"]


@pytest.mark.engine
def test_pause_freezes_the_server_until_resume(vllm: VllmServer) -> None:
    """pause() stops the server answering; resume() brings it back."""
    vllm.pause()
    try:
        with pytest.raises((TimeoutError, urllib.error.URLError)):
            _NO_PROXY.open(f"{vllm.url}/health", timeout=1).close()
    finally:
        vllm.resume()

    with _NO_PROXY.open(f"{vllm.url}/health", timeout=30) as response:
        assert response.status == 200


# The servers are session engines every other test is done with: ``ends_engine`` runs this
# last, so no engine starts for it alone. The kill is of the main engine, last of all: the
# spare is already dead by then (test_faults_replica.py kills it), and a restart costs ~25 s.
@pytest.mark.engine
@pytest.mark.parametrize(
    ("how", "engine"),
    [
        pytest.param("stop", "vllm_b", marks=pytest.mark.ends_engine("vllm_b")),
        pytest.param("kill", "vllm", marks=pytest.mark.ends_engine("vllm")),
    ],
)
def test_stopping_leaves_no_process(request: pytest.FixtureRequest, how: str, engine: str) -> None:
    """stop() and kill() end the server and every process of its group, and free the port."""
    server: VllmServer = request.getfixturevalue(engine)
    pid = server.pid
    assert group_alive(pid)

    getattr(server, how)()

    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not group_alive(pid)
    assert not port_in_use(server.port)


@pytest.mark.engine
def test_start_reports_the_log_tail_when_the_engine_dies(
    engine_paths: EnginePaths, tmp_path: Path
) -> None:
    """If vllm serve exits during start-up, start() raises with the end of its log."""
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    server = VllmServer(broken, python=engine_paths.python, launcher=engine_paths.launcher)

    with pytest.raises(ServerError, match="exited with status") as caught:
        server.start()

    assert "no-such-architecture" in str(caught.value)
    assert not group_alive(server.pid)


@pytest.mark.inproc
def test_start_refuses_a_port_that_is_taken(tmp_path: Path) -> None:
    """start() refuses a port something already listens on, instead of probing it."""
    (tmp_path / "config.json").write_text("{}")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        server = VllmServer(tmp_path, port=port, python=Path(sys.executable))

        with pytest.raises(ServerError, match="already in use"):
            server.start()


@pytest.mark.inproc
def test_start_without_engine_python_says_to_run_setup(tmp_path: Path) -> None:
    """start() without an engine venv names the command that creates it."""
    server = VllmServer(tmp_path, python=tmp_path / "missing" / "python")

    with pytest.raises(ServerError, match="vllm-obs engine setup"):
        server.start()


def test_engine_home_follows_vllm_obs_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """engine_home() is $VLLM_OBS_HOME when set, else ~/.cache/vllm-obs."""
    monkeypatch.setenv("VLLM_OBS_HOME", str(tmp_path))
    assert engine_home() == tmp_path

    monkeypatch.delenv("VLLM_OBS_HOME")
    assert engine_home() == Path.home() / ".cache" / "vllm-obs"


@pytest.mark.engine
def test_a_started_engine_left_its_model_inspection_in_the_engine_home(
    vllm: VllmServer,
) -> None:
    """vLLM wrote its model inspection through the start's linked cache, for the next start."""
    shared = engine_home() / "vllm-cache" / "modelinfos"
    assert any("LlamaForCausalLM" in p.name for p in shared.glob("*.json"))
