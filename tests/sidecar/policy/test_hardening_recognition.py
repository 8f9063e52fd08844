"""Recognition from the attacker's side (issue 38): refused requests cannot flush a victim's
document from the prefix memory, and a victim's tenant header cannot be used to mark it slow.

Real sidecar processes, requests from distinct loopback addresses (127.0.0.x). The pool is
``ScriptedUpstream``: it answers every chat at once, and sends a stream of many megabytes
when a test needs one a client can read slowly (a real engine on CPU would take minutes to
generate that much); what is tested is what the relay remembers, not what a pool does.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from bench.client_time import raw_post, read_paced
from tests.conftest import SidecarFactory
from tests.support import event_of
from tests.support.probes import DONE_FRAME
from tests.support.scripted_upstream import Script, ScriptedUpstream, token_frame, usage_frame

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


def _stream_from(pool: ScriptedUpstream, port: int, addr: str, tenant: str, rate: float) -> str:
    """A streamed chat from ``addr`` naming ``tenant``, read at ``rate`` bytes/s through a
    4 KiB receive window (set before connect, so the sidecar's writes wait on it); its id."""
    rid = uuid.uuid4().hex
    frames = [token_frame(f"{i:04d} " + "x" * 300) for i in range(60)]  # ~20 KB
    pool.scripts[rid] = Script(pieces=[*frames, usage_frame(5, 60), DONE_FRAME], gap_s=0)
    body = orjson.dumps({"model": "tiny", "stream": True,
                         "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(60)
        sock.bind((addr, 0))
        sock.connect(("127.0.0.1", port))
        sock.sendall(raw_post(CHAT, body, "close", {"x-request-id": rid, "x-tenant": tenant}))
        data, _ = read_paced(sock, "close", rate)
    assert data.startswith(b"HTTP/1.1 200"), data[:200]
    return rid


def test_a_victims_tenant_header_cannot_mark_it_slow(
    sidecar: SidecarFactory, pool: ScriptedUpstream, tmp_path: Path
) -> None:
    """An attacker on 127.0.0.2 naming the victim's tenant in the header reads a stream slowly:
    its own next stream is learned slow (lane ``slow``), but the victim's, from 127.0.0.3 with
    the same tenant header, stays in the default lane."""
    config = _write(tmp_path, {
        "auth": {"tenant_header": "x-tenant"},
        "pools": [{"name": "p", "replicas": [pool.url]}],
        "recognition": {"client_id": "tenant", "slow_stream_ms": 500},
        "lanes": [
            {"name": "slow", "pool": "p", "match": [{"slow_reader": True, "stream": True}]},
            {"name": "main", "pool": "p"},
        ],
        "default_lane": "main",
    })  # fmt: skip
    sc = sidecar(config=config, traces=False)
    t0 = time.monotonic()
    taught = _stream_from(pool, sc.port, "127.0.0.2", "gold", 12_000)  # ~1.7 s of reading
    read_s = time.monotonic() - t0
    attacker = _stream_from(pool, sc.port, "127.0.0.2", "gold", 1e12)
    victim = _stream_from(pool, sc.port, "127.0.0.3", "gold", 1e12)
    assert read_s > 1.0  # the slow read was slow
    assert event_of(sc, taught)["lane"] == "main"
    assert (event_of(sc, attacker)["lane"], event_of(sc, attacker)["class_source"]) == (
        "slow",
        "learned",
    )
    assert event_of(sc, victim)["lane"] == "main"
