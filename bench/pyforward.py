"""The floor of a relay written in Python: a TCP forwarder on uvloop, nothing else.

Each client connection gets its own connection to the upstream, and every read on
either side is written to the other as it is: one ``data_received`` and one
``transport.write`` per piece, no HTTP parsing, no record. ``bench.relay`` runs it
as the ``pyforward`` target beside nginx, so the table shows what the interpreter
and the event loop cost per token and per request before the sidecar does any
work of its own (docs/performance.md).

    python -m bench.pyforward --port 8001 --upstream-port 8000
"""

from __future__ import annotations

import argparse
import asyncio

import uvloop


class _Upstream(asyncio.Protocol):
    def __init__(self, client: _Client) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.transport.close()


class _Client(asyncio.Protocol):
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.upstream: asyncio.Transport | None = None
        self.held: list[bytes] = []  # what the client sent before the upstream connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            up, _ = await loop.create_connection(
                lambda: _Upstream(self), "127.0.0.1", self.upstream_port
            )
        except OSError:
            self.transport.close()
            return
        self.upstream = up
        for data in self.held:
            up.write(data)
        self.held.clear()

    def data_received(self, data: bytes) -> None:
        if self.upstream is None:
            self.held.append(data)
        else:
            self.upstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.close()


async def serve(port: int, upstream_port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _Client(upstream_port), "127.0.0.1", port, backlog=2048
    )
    await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.pyforward", description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--upstream-port", type=int, required=True)
    args = ap.parse_args(argv)
    uvloop.run(serve(args.port, args.upstream_port))


if __name__ == "__main__":
    main()
