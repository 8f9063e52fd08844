"""Bodies that trickle are slow clients (issue 63): evicted for a newcomer at the connection
cap, and closed when no byte comes for ``body_idle_timeout_s``.

Raw sockets on 127.0.6.x against the in-process sidecar; the pool is ``ScriptedUpstream``
(these tests are about the relay's port). The eviction rule itself (no byte for
``body_stall_s``, or slower than ``min_body_rate``) is pinned in virtual time on
``body_clock.body_stalled``; the in-process sidecar runs it with ``body_stall_s`` 0, so an
unfinished body yields to a newcomer whatever the machine's speed.
"""

from __future__ import annotations

import json
import socket

import pytest

from obs.sidecar.server.body_clock import BodyClock, body_stalled
from obs.sidecar.server.limits import Limits
from tests.sidecar.conftest import InprocFactory
from tests.support.inproc import lane_config, request_id
from tests.support.rawhttp import read_all, status
from tests.support.scripted_upstream import ScriptedUpstream

CAP = 8
ADDRESSES = ("127.0.6.2", "127.0.6.3", "127.0.6.4", "127.0.6.5")
NEWCOMER = "127.0.6.9"
HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    b"content-length: 100\r\n\r\n{"
)


def _open(addr: str, port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(addr, 0))
    s.settimeout(30)
    return s


def _chat(port: int) -> bytes:
    """A whole chat from ``NEWCOMER`` on a new connection: the answer."""
    body = json.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    ).encode()
    with _open(NEWCOMER, port) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"x-request-id: %b\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%b"
            % (request_id().encode(), len(body), body)
        )
        return read_all(s)


def _said(s: socket.socket) -> int:
    """The status the sidecar has written to ``s`` so far (0: nothing yet)."""
    s.setblocking(False)
    try:
        return status(s.recv(4096))
    except BlockingIOError:
        return 0


@pytest.mark.inproc
def test_trickling_bodies_from_four_addresses_cannot_fill_the_cap(
    scripted: ScriptedUpstream, inproc: InprocFactory
) -> None:
    """Four addresses fill ``--max-connections`` with bodies that trickle (one byte of 100):
    three newcomers' chats in turn are answered 200, one trickler closed with 408 for the
    first (the others reuse its place) (before: 503 for every newcomer)."""
    limits = Limits(max_connections=CAP, body_stall_s=0.0, idle_timeout_s=60.0,
                    header_timeout_s=60.0)  # fmt: skip
    sc = inproc(lane_config({"main": [scripted.url]}), limits=limits)
    held = [_open(a, sc.port) for a in ADDRESSES for _ in range(CAP // len(ADDRESSES))]
    try:
        for s in held:
            s.sendall(HEAD)  # the head and one byte of a 100-byte body, then nothing
        sc.on_loop(lambda: None, turns=10)  # every trickler's head has been read
        answers = [status(_chat(sc.port)) for _ in range(3)]
        said = [_said(s) for s in held]
    finally:
        for s in held:
            s.close()
    assert answers == [200] * 3
    assert sorted(said) == [0] * (CAP - 1) + [408]  # the first took its place; then its own


def test_a_body_with_no_byte_for_body_stall_s_is_stalled() -> None:
    """Virtual time: a body silent for ``body_stall_s`` is a slow client; one whose bytes keep
    coming is not, until its average rate falls under ``min_body_rate``."""
    lim = Limits(body_stall_s=2.0, min_body_rate=1000)
    assert not body_stalled(lim, began=100.0, last=100.0, got=1, now=101.9)
    assert body_stalled(lim, began=100.0, last=100.0, got=1, now=102.0)
    assert not body_stalled(lim, began=100.0, last=109.5, got=20_000, now=110.0)  # 2 KB/s
    assert body_stalled(lim, began=100.0, last=109.5, got=5_000, now=110.0)  # 0.5 KB/s
    assert not body_stalled(lim, began=100.0, last=101.0, got=10, now=101.5)  # too young
    clock = BodyClock()
    clock.start(100.0, lim)
    clock.progress(1, 100.5)
    assert clock.deadline(lim) == min(100.0 + lim.body_timeout_s, 100.5 + lim.body_idle_timeout_s)
    assert clock.stalled(lim, 102.5) and not clock.stalled(lim, 101.0)


@pytest.mark.inproc
def test_a_body_with_no_byte_for_the_idle_timeout_is_closed_408(
    scripted: ScriptedUpstream, inproc: InprocFactory
) -> None:
    """A body that stops after one byte is answered 408 once ``body_idle_timeout_s`` passes
    with no byte, long before its whole ``body_timeout_s`` (before: held the full minute)."""
    limits = Limits(body_timeout_s=600.0, body_idle_timeout_s=0.2)
    sc = inproc(lane_config({"main": [scripted.url]}), limits=limits)
    with _open("127.0.6.6", sc.port) as s:
        s.sendall(HEAD)
        answer = read_all(s)  # until the sidecar closes (the socket's 30 s otherwise)
    assert status(answer) == 408, answer


@pytest.mark.inproc
def test_slow_bodies_filling_body_memory_yield_to_a_newcomer(
    scripted: ScriptedUpstream, inproc: InprocFactory
) -> None:
    """Four addresses fill the body memory with bodies sent in part (each within its share):
    a fifth address's 100 KiB chat is answered 200, and the slowest holder is refused 503
    to make room (before: 503 for every other POST while the uploads held it)."""
    limits = Limits(max_body_memory=1 << 20, body_idle_timeout_s=600.0, idle_timeout_s=600.0)
    sc = inproc(lane_config({"main": [scripted.url]}), limits=limits)
    part = 120 << 10
    held = [_open(a, sc.port) for a in ADDRESSES for _ in range(2)]
    try:
        for s in held:  # 8 x 120 KiB of 200 KiB bodies: 960 KiB of the 1 MiB
            s.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                b"application/json\r\ncontent-length: %d\r\n\r\n%b" % (200 << 10, b" " * part)
            )
            sc.on_loop(lambda: None, turns=10)  # read in order: the first is the slowest
        text = "word " * (20 << 10)  # a 100 KiB prompt
        body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": text}],
                           "max_tokens": 4}).encode()  # fmt: skip
        with _open(NEWCOMER, sc.port) as s:
            s.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                b"application/json\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%b"
                % (len(body), body)
            )
            answer = status(read_all(s))
        said = [_said(s) for s in held]
    finally:
        for s in held:
            s.close()
    assert answer == 200
    assert said.count(503) >= 1 and set(said) <= {0, 503}
