"""Request smuggling through ``Upgrade``, and a redirect to the client's ``Host`` (issue 25).

A real sidecar process (one for the module), raw sockets. The pool is ``ScriptedUpstream``:
a plain HTTP server that keeps every request it was sent, because no real vLLM reports how
many requests reached it and with which bodies.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import orjson
import pytest

from obs.sidecar.testing import SidecarProcess
from tests.support.probes import metric
from tests.support.rawhttp import connect, exchange, read_all, status
from tests.support.scripted_upstream import ScriptedUpstream

pytestmark = pytest.mark.process

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def pool() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as up:
        yield up


@pytest.fixture(scope="module")
def relay(
    pool: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SidecarProcess]:
    """One sidecar for the module: each test judges what its own requests did (counts taken
    before and after), not the sidecar's whole history."""
    work = tmp_path_factory.mktemp("smuggling")
    with SidecarProcess(
        upstream=pool.url,
        events=work / "events.jsonl",
        env={"OTEL_TRACES_EXPORTER": "none"},
        log_path=work / "sidecar.log",
    ) as sc:
        yield sc


def _upgrades(relay: SidecarProcess) -> float:
    return metric(relay.url, "vllm_obs_connection_limits_total", limit="upgrade")


def _smuggled() -> bytes:
    body = orjson.dumps({**CHAT, "messages": [{"role": "user", "content": "smuggled"}]})
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%b" % (len(body), body)
    )


@pytest.mark.parametrize("upgrade", [b"h2c", b"websocket", b"foo"])
def test_upgrade_with_a_body_in_a_second_read_never_reaches_the_pool_as_two(
    relay: SidecarProcess, pool: ScriptedUpstream, upgrade: bytes
) -> None:
    """An Upgrade POST whose body (a whole second request) comes in a later read is refused."""
    received, upgrades = len(pool.received), _upgrades(relay)
    inner = _smuggled()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"connection: upgrade\r\nupgrade: %b\r\ncontent-length: %d\r\n\r\n" % (upgrade, len(inner))
    )
    with connect(relay.port) as s:
        s.sendall(head)
        time.sleep(0.3)  # the body in its own read
        with contextlib.suppress(OSError):  # refused and closed already
            s.sendall(inner)
        answer = read_all(s)
    assert status(answer) == 400
    assert b"Upgrade" in answer
    time.sleep(0.5)  # anything relayed would have reached the pool by now
    assert len(pool.received) - received <= 1
    assert not any(b"smuggled" in body for _, body in pool.received[received:])
    assert _upgrades(relay) - upgrades == 1


def test_upgrade_on_a_get_without_a_body_is_served_as_http11(relay: SidecarProcess) -> None:
    """``curl --http2`` sends ``Upgrade: h2c`` on a GET: /health answers it as plain HTTP/1.1."""
    req = (
        b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: Upgrade, HTTP2-Settings\r\n"
        b"upgrade: h2c\r\nhttp2-settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n"
    )
    with connect(relay.port) as s:
        s.sendall(req)
        answer = s.recv(65536)  # the connection stays open (keep-alive): one read
    assert status(answer) == 200


def test_a_get_with_upgrade_and_a_body_is_refused(
    relay: SidecarProcess, pool: ScriptedUpstream
) -> None:
    """A GET /health with Upgrade and a body holding a chat request smuggles nothing."""
    received = len(pool.received)
    inner = _smuggled()
    head = (
        b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: h2c\r\n"
        b"content-length: %d\r\n\r\n" % len(inner)
    )
    assert status(exchange(relay.port, head + inner)) == 400
    time.sleep(0.5)
    assert pool.received[received:] == []


@pytest.mark.parametrize("path", ["/v1/models/", "/health/", "/metrics/"])
def test_trailing_slash_never_redirects_to_the_clients_host(
    relay: SidecarProcess, path: str
) -> None:
    """``Host: evil.example`` on a path with a trailing slash is not redirected anywhere."""
    answer = exchange(
        relay.port,
        b"GET %b HTTP/1.1\r\nhost: evil.example\r\nconnection: close\r\n\r\n" % path.encode(),
    )
    assert b"evil.example" not in answer
    assert status(answer) == 404
