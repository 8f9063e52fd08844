"""Recognition from the attacker's side (issue 38): refused requests cannot flush a victim's
document from the prefix memory, and a victim's tenant header cannot be used to mark it slow.

Real sidecar processes, requests from distinct loopback addresses (127.0.0.x). The pool is
``ScriptedUpstream``: it answers every chat at once, and sends a stream of many megabytes
when a test needs one a client can read slowly (a real engine on CPU would take minutes to
generate that much); what is tested is what the relay remembers, not what a pool does.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import SidecarFactory
from tests.support import event_of
from tests.support.scripted_upstream import ScriptedUpstream

CHAT = "/v1/chat/completions"


@pytest.fixture
def pool() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as up:
        yield up


def _write(tmp_path: Path, config: dict[str, Any]) -> Path:
    path = tmp_path / "lanes.yaml"
    path.write_text(yaml.safe_dump({"version": 1, **config}), encoding="utf-8")
    return path


def _client(url: str, addr: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=30, transport=httpx.HTTPTransport(local_address=addr))


def _chat(c: httpx.Client, text: str, **headers: str) -> tuple[int, str]:
    """One non-streamed chat of ``text``; its status and request id."""
    rid = uuid.uuid4().hex
    body = {"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    r = c.post(CHAT, json=body, headers={"x-request-id": rid, **headers})
    return r.status_code, rid


def test_refused_requests_cannot_flush_a_victims_document(
    sidecar: SidecarFactory, pool: ScriptedUpstream, tmp_path: Path
) -> None:
    """An attacker on 127.0.0.2 sends 300 requests with unique 5 KB prefixes, all refused by
    admission, against a prefix memory of 64: the victim's document (127.0.0.3), sent again,
    is still recognised (lane ``seen``); 100 admitted ones then do flush it (the bound is real)."""
    config = _write(tmp_path, {
        "pools": [{"name": "p", "replicas": [pool.url]}],
        "recognition": {"max_prefixes": 64},
        "lanes": [
            {"name": "batch", "pool": "p", "match": [{"header": {"x-client-class": "batch"}}],
             "admission": {"max_prompt_tokens": 10}},
            {"name": "seen", "pool": "p", "match": [{"prefix_seen": True}]},
            {"name": "chat", "pool": "p"},
        ],
        "default_lane": "chat",
    })  # fmt: skip
    sc = sidecar(config=config, traces=False)
    document = "the victim's document " * 250  # 5,500 characters: over the 4,096 of a key
    with _client(sc.url, "127.0.0.3") as victim, _client(sc.url, "127.0.0.2") as attacker:
        status, first = _chat(victim, document + "question 1")
        assert status == 200
        refused = 0
        for i in range(300):
            status, _ = _chat(attacker, f"{i:06d} " + "x" * 5000, **{"x-client-class": "batch"})
            refused += status != 200
        status, again = _chat(victim, document + "question 2")
        assert status == 200
        for i in range(100):  # admitted: each is remembered, the oldest forgotten
            assert _chat(attacker, f"{i:06d} " + "y" * 5000)[0] == 200
        status, flushed = _chat(victim, document + "question 3")
        assert status == 200
    assert refused == 300
    assert event_of(sc, first)["lane"] == "chat"  # the first time: not seen
    assert event_of(sc, again)["lane"] == "seen"  # still remembered after the refused flood
    assert event_of(sc, flushed)["lane"] == "chat"  # 100 admitted prefixes past 64 flush it
