"""Opt-in text capture: off by default; with --capture-text, redacted text in the event only."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import openai
import pytest

from obs.engines.server import VllmServer
from obs.sidecar.record.capture import HOOK_FAILED, prompt_text, redact
from obs.sidecar.testing import OtlpReceiver
from tests.conftest import SidecarFactory

EMAIL = "jane.doe@example.com"
KEY = "sk-live-0123456789abcdefXYZ"
PROMPT = f"Summarise the ticket from {EMAIL}; her key is {KEY} and phone +44 20 7946 0958."


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def _chat(url: str, stream: bool, rid: str) -> str:
    """One chat request with the secrets in its prompt; the text the client received."""
    client = _client(url)
    kw = {
        "model": "tiny",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 24,
        "extra_headers": {"x-request-id": rid},
    }
    if stream:
        parts = []
        for chunk in client.chat.completions.create(**kw, stream=True):  # type: ignore[call-overload]
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
        return "".join(parts)
    reply = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    return str(reply.choices[0].message.content)


def test_default_redactor_masks_emails_keys_numbers_and_ips() -> None:
    """redact(): e-mail, API key, bearer token, long number and IPv4 are masked; words stay."""
    text = f"{PROMPT} Authorization: Bearer abc.def-ghi 10.1.2.3 card 4111 1111 1111 1111"
    out = redact(text)
    for secret in (EMAIL, KEY, "abc.def-ghi", "10.1.2.3", "4111 1111", "7946"):
        assert secret not in out, (secret, out)
    assert out.startswith("Summarise the ticket from [email]; her key is [token]")


def test_prompt_text_joins_messages_and_text_parts() -> None:
    """Chat messages become 'role: text' lines (text parts only); a completion's prompt as is."""
    body = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]},
        ]
    }
    assert prompt_text(body) == "system: be brief\nuser: hi"
    assert prompt_text({"prompt": "once upon"}) == "once upon"
    assert prompt_text({"prompt": [1, 2, 3]}) == ""


@pytest.mark.engine
def test_capture_off_by_default_keeps_text_out_of_events_spans_and_logs(
    vllm: VllmServer, sidecar: SidecarFactory, otlp_receiver: OtlpReceiver
) -> None:
    """Without --capture-text: no prompt or output text in the event, the spans or the log."""
    sc = sidecar(vllm.url)
    rid = uuid.uuid4().hex
    answer = _chat(sc.url, True, rid)
    ev = sc.wait_events(1)[0]
    assert ev["prompt_text"] is None and ev["output_text"] is None
    spans = otlp_receiver.wait_for(ev["trace_id"], ["chat tiny"])
    assert spans
    sc.stop()
    assert sc.events_path is not None and sc.log_path is not None
    for blob in (
        sc.events_path.read_bytes(),
        b"".join(otlp_receiver.raw),
        sc.log_path.read_bytes(),
    ):
        assert EMAIL.encode() not in blob and b"Summarise" not in blob
        assert len(answer) < 8 or answer.encode() not in blob


@pytest.mark.engine
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_capture_all_writes_redacted_prompt_and_the_output_the_client_got(
    vllm: VllmServer, sidecar: SidecarFactory, otlp_receiver: OtlpReceiver, stream: bool
) -> None:
    """--capture-text all: prompt redacted by the default hook; output = what the client read."""
    sc = sidecar(vllm.url, args=("--capture-text", "all"))
    rid = uuid.uuid4().hex
    answer = _chat(sc.url, stream, rid)
    ev = sc.wait_events(1)[0]
    assert ev["request_id"] == rid
    assert ev["prompt_text"] == redact(f"user: {PROMPT}")
    assert EMAIL not in ev["prompt_text"] and KEY not in ev["prompt_text"]
    assert ev["output_text"] == redact(answer)[:4096] and answer
    # Spans never carry the text, even when events do.
    otlp_receiver.wait_for(ev["trace_id"], ["chat tiny"])
    assert b"[email]" not in b"".join(otlp_receiver.raw)
    assert b"Summarise" not in b"".join(otlp_receiver.raw)


@pytest.mark.engine
def test_custom_hook_and_cap_apply_and_a_failing_hook_drops_only_the_text(
    vllm: VllmServer, sidecar: SidecarFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--redact-hook MODULE:FUNCTION is used and --capture-max-chars cuts; a raising hook
    leaves HOOK_FAILED in place of the text and the event is still written."""
    (tmp_path / "myhooks.py").write_text(
        "def shout(text):\n    return text.upper()\n\n"
        "def broken(text):\n    raise ValueError('no')\n",
        encoding="utf-8",
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the sidecar subprocess imports the hook
    args = ("--capture-text", "prompt", "--redact-hook", "myhooks:shout")
    sc = sidecar(vllm.url, args=(*args, "--capture-max-chars", "20"))
    _chat(sc.url, False, uuid.uuid4().hex)
    ev = sc.wait_events(1)[0]
    assert ev["prompt_text"] == f"USER: {PROMPT}".upper()[:20]
    assert ev["output_text"] is None  # prompt only
    bad = sidecar(vllm.url, args=("--capture-text", "all", "--redact-hook", "myhooks:broken"))
    _chat(bad.url, True, uuid.uuid4().hex)
    ev = bad.wait_events(1)[0]
    assert (ev["status"], ev["prompt_text"], ev["output_text"]) == ("ok", HOOK_FAILED, HOOK_FAILED)


@pytest.mark.parametrize(
    ("capture", "message"),
    [
        ("all", "--redact-hook: cannot import 'no_such_module'"),
        ("none", "--redact-hook is only used with --capture-text"),
    ],
)
@pytest.mark.process
def test_bad_redact_hook_is_a_clear_error_at_start(capture: str, message: str) -> None:
    """A hook that cannot be imported, or one given without capture, stops the start in a line."""
    cmd = [
        sys.executable, "-m", "obs.cli", "sidecar", "--upstream", "http://127.0.0.1:9",
        "--events", "none", "--capture-text", capture, "--redact-hook", "no_such_module:f",
    ]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.stderr
