"""The relay's HTTP/1.1 client to the pools: keep-alive connections, bodies in callbacks.

Why not aiohttp here (it still serves pool polling and ``/v1/models``): on the
token path aiohttp hands each read to a ``StreamReader`` and wakes the relay's
task to take it, one task switch and a few Python frames per token. Here a
pool connection is a plain asyncio protocol with an httptools parser; the
de-chunked body of each socket read goes to the response's ``sink`` in one
piece inside the socket's ``data_received``, so the relay can time, classify
and forward a token without a task switch, and writes once per read however
many HTTP chunks the read carried. Whole bodies (non-streamed answers, errors) are
buffered and awaited once.

Connections are kept per replica and reused while idle for less than
``IDLE_S`` (below uvicorn's, and so vLLM's, 5 s keep-alive). A request is retried
only where the pool cannot have read it: written on a kept-alive connection that
closed before a byte of the answer (``obs.sidecar.pools.pool_conn``); a pool that
fails after the request was written otherwise may have started generating.
One connection and its response: ``obs.sidecar.pools.pool_conn``.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from urllib.parse import urlsplit

from obs.sidecar.outcomes import ConnectFailed, UpstreamError
from obs.sidecar.pools.pool_conn import PoolConn, Response, Sink

__all__ = ["ConnectFailed", "PoolConn", "Response", "Sink", "Upstream", "UpstreamError"]

IDLE_S = 3.0  # reuse a connection idle for less than this
MAX_IDLE_PER_REPLICA = 512
RESEND_CONNECT_S = 10.0  # the new connection of a request the pool closed idle as it was sent


class Upstream:
    """Keep-alive HTTP/1.1 connections to the pools' replicas, used by the relay."""

    def __init__(self, idle_s: float = IDLE_S) -> None:
        self.idle_s = idle_s
        self.connections_opened = 0
        self._idle: dict[str, list[PoolConn]] = {}
        self._targets: dict[str, tuple[str, int, bool, str, bytes]] = {}
        self._all: set[PoolConn] = set()
        self._tls: ssl.SSLContext | None = None
        self.resent = 0  # requests written again after the pool closed a kept-alive connection
        self._resending: set[asyncio.Task[None]] = set()

    def _target(self, base_url: str) -> tuple[str, int, bool, str, bytes]:
        target = self._targets.get(base_url)
        if target is None:
            parts = urlsplit(base_url)
            tls = parts.scheme == "https"
            host = parts.hostname or "127.0.0.1"
            port = parts.port or (443 if tls else 80)
            host_header = parts.netloc.rsplit("@", 1)[-1].encode("idna")
            target = self._targets[base_url] = (
                host, port, tls, parts.path.rstrip("/"), host_header
            )  # fmt: skip
        return target

    async def connect(self, base_url: str, connect_s: float | None) -> PoolConn:
        """A new connection to ``base_url``; ``ConnectFailed`` when none is made within
        ``connect_s`` (None: no limit)."""
        host, port, tls, _, _ = self._target(base_url)
        loop = asyncio.get_running_loop()
        if tls and self._tls is None:
            self._tls = ssl.create_default_context()
        try:
            async with asyncio.timeout(connect_s):
                _, conn = await loop.create_connection(
                    lambda: PoolConn(base_url, self),
                    host,
                    port,
                    ssl=self._tls if tls else None,
                    server_hostname=host if tls else None,
                )
        except TimeoutError as err:
            raise ConnectFailed(f"connection not accepted within {connect_s:g} s") from err
        except OSError as err:
            raise ConnectFailed(f"cannot connect: {err.strerror or err}") from err
        self._all.add(conn)
        self.connections_opened += 1
        return conn

    def open_connections(self) -> int:
        """Connections open now, busy or idle."""
        return len(self._all)

    def idle(self, base_url: str) -> PoolConn | None:
        """A kept-alive connection to ``base_url`` still fresh, taken from the idle ones."""
        idle = self._idle.get(base_url)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.lost and now - conn.idle_since < self.idle_s:
                conn.reused = True
                return conn
            if conn.transport is not None:
                conn.transport.close()
        return None

    async def post(
        self,
        base_url: str,
        path: str,
        body: bytes,
        headers: dict[str, str],
        connect_s: float | None = None,
    ) -> Response:
        """Send one POST and return once the response's head is in."""
        conn = self.idle(base_url) or await self.connect(base_url, connect_s)
        resp = self.send(conn, base_url, path, body, headers)
        await resp.wait_head()
        return resp

    def send(
        self, conn: PoolConn, base_url: str, path: str, body: bytes, headers: dict[str, str],
        method: str = "POST",
    ) -> Response:  # fmt: skip
        """Write one request (a POST, or a ``method`` one) on ``conn`` (from ``idle`` or
        ``connect``); its head is awaited with ``Response.wait_head``."""
        _, _, _, prefix, host = self._target(base_url)
        resp = conn.resp = Response(conn, asyncio.get_running_loop())
        verb = b"POST " if method == "POST" else method.encode("ascii") + b" "
        head = [verb, (prefix + path).encode("latin-1"), b" HTTP/1.1\r\nhost: ", host]
        for k, v in headers.items():
            head += (b"\r\n", k.encode("latin-1"), b": ", v.encode("latin-1"))
        head += (b"\r\ncontent-length: %d\r\n\r\n" % len(body), body)
        assert conn.transport is not None
        data = b"".join(head)
        conn.transport.write(data)
        if conn.reused:
            resp.resend = (base_url, data)
        return resp

    def resend(self, resp: Response) -> None:
        """The pool closed ``resp``'s kept-alive connection before any byte of the answer:
        write the request again on a new connection, once (``obs.sidecar.pools.pool_conn``)."""
        assert resp.resend is not None
        base_url, data = resp.resend
        resp.resend = None
        task = asyncio.get_running_loop().create_task(self._resend(resp, base_url, data))
        self._resending.add(task)
        task.add_done_callback(self._resending.discard)

    async def _resend(self, resp: Response, base_url: str, data: bytes) -> None:
        try:
            conn = await self.connect(base_url, RESEND_CONNECT_S)
        except ConnectFailed as err:
            resp._fail(
                UpstreamError(f"the pool closed its connection as the request was sent ({err})")
            )
            return
        if resp.head.done() or conn.transport is None:  # closed meanwhile (a deadline, the client)
            if conn.transport is not None:
                conn.transport.close()
            return
        self.resent += 1
        conn.resp, resp._conn = resp, conn
        conn.transport.write(data)

    def _park(self, conn: PoolConn) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= MAX_IDLE_PER_REPLICA or conn.transport is None:
            if conn.transport is not None:
                conn.transport.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def _forget(self, conn: PoolConn) -> None:
        self._all.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    def close(self) -> None:
        for conn in list(self._all):
            if conn.transport is not None:
                conn.transport.close()
        self._idle.clear()
