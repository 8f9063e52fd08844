"""Replies a rate-limit store should never send (issue 63): a reply that is not the script's
(a string, a short or long list, a huge one, out-of-range values) is a store error, handled as
``on_store_error`` says (admitted when open, 503 ``rate_limit_store`` when closed), never a 500.

The store here is a fake Redis on 127.0.0.1 that answers every script call with one set reply:
a real Redis running the sidecar's script cannot be made to answer garbage (a fake for what no
real part can produce). The real Redis path is ``tests/sidecar/relay/test_rate_store.py``.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import pytest

from obs import conventions as c
from obs.config import parse_config
from obs.sidecar.outcomes import Rejected
from obs.sidecar.relay.rate_store import RateLimiter

pytestmark = pytest.mark.inproc


def _command(f: socket.SocketIO) -> list[bytes] | None:
    """One RESP command (an array of bulk strings) read from ``f``; None at its end."""
    line = f.readline()
    if not line.startswith(b"*"):
        return None
    out = []
    for _ in range(int(line[1:])):
        size = int(f.readline()[1:])
        out.append(f.read(size + 2)[:size])
    return out


class GarbageRedis:
    """Answers ``CLIENT``/``HELLO`` with ``+OK`` and every other command with ``reply``."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.sock.getsockname()[1]}/0"
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as f:
            while (cmd := _command(f)) is not None:  # type: ignore[arg-type]
                name = cmd[0].upper() if cmd else b""
                try:
                    conn.sendall(b"+OK\r\n" if name in (b"CLIENT", b"HELLO") else self.reply)
                except OSError:  # the client hung up on a reply it would not read
                    return


@pytest.fixture
def garbage(request: pytest.FixtureRequest) -> Iterator[GarbageRedis]:
    fake = GarbageRedis(request.param)
    fake.thread.start()
    yield fake
    fake.sock.close()


def _limiter(url: str, on_error: str) -> RateLimiter:
    config = parse_config(
        {
            "pools": [{"name": "p", "replicas": ["http://127.0.0.1:9"]}],
            "lanes": [{"name": "main", "pool": "p"}],
            "default_lane": "main",
            "tenants": {"acme": {"tokens_per_minute": 1000}},
            "rate_limits": {"store": url, "on_store_error": on_error, "timeout_s": 2.0},
        }
    )
    return RateLimiter(config)


REPLIES = [
    b"+OK\r\n",  # a status, not the script's list
    b"$5\r\nhello\r\n",  # a string: iterating it gave numbers
    b"*2\r\n:1\r\n:2\r\n",  # too short
    b"*6\r\n:1\r\n:5\r\n:0\r\n:0\r\n:10\r\n:11\r\n",  # too long for one counter
    b"*5\r\n:7\r\n:5\r\n:0\r\n:0\r\n:-3\r\n",  # out of range
    b"*5\r\n$1\r\nx\r\n:5\r\n:0\r\n:0\r\n:10\r\n",  # a string among the numbers
]


@pytest.mark.parametrize("garbage", REPLIES, indirect=True)
def test_a_garbage_reply_is_a_store_error(garbage: GarbageRedis) -> None:
    """Open: the request is admitted uncharged (None) and the error counted; closed: 503
    ``rate_limit_store`` (before: a 500, or a decision read from the garbage)."""
    failed: list[int] = []

    async def go(on_error: str) -> object:
        limiter = _limiter(garbage.url, on_error)
        limiter.store_failed = lambda: failed.append(1)
        try:
            return await limiter.charge("acme", None, 10, 10)
        finally:
            await limiter.close()

    assert asyncio.run(go("open")) is None
    with pytest.raises(Rejected) as closed:
        asyncio.run(go("closed"))
    assert closed.value.rejection_reason == c.RATE_LIMIT_STORE and closed.value.status == 503
    assert len(failed) == 2


HUGE = b"*2000000\r\n" + b":1\r\n" * 2_000_000  # 8 MB: the review's 12.8 s stall


@pytest.mark.parametrize("garbage", [HUGE, b"$100000000\r\n"], indirect=True)
def test_a_huge_reply_is_refused_before_it_is_read(garbage: GarbageRedis) -> None:
    """A reply of two million elements (or a 100 MB string) is a store error named by its
    size line alone: refused before redis-py reads it (before: all of it was parsed, with the
    event loop held, and only then refused for its length). Closed: 503 ``rate_limit_store``."""

    async def go() -> object:
        limiter = _limiter(garbage.url, "closed")
        try:
            return await limiter.charge("acme", None, 10, 10)
        finally:
            await limiter.close()

    with pytest.raises(Rejected) as closed:
        asyncio.run(go())
    assert closed.value.rejection_reason == c.RATE_LIMIT_STORE and closed.value.status == 503
    assert "more than" in str(closed.value) and "not the script's" in str(closed.value)
