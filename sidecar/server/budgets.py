"""What all clients, and each client address, may hold at once: connections and body bytes.

Pure bookkeeping for ``obs.sidecar.server.guard`` (on the event loop, no locks): a
connection or a request body is admitted only while both the global budget and
its address's budget have room, so one address flooding the port with silent
sockets or large bodies takes at most its share and leaves the rest to others.
A body is counted as its bytes arrive (never by its declared ``Content-Length``: a
declared body that never comes holds nothing) until its response is complete.

``nofile_cap`` fits the connection cap to the process's open-file limit: each
relayed request holds two descriptors (the client's and the pool's), and the
process keeps some for itself (listeners, event files, the pools' polling).
"""

from __future__ import annotations

import contextlib
import resource

RESERVED_FDS = 128  # descriptors kept for everything but client and pool connections


class Budgets:
    """Connections and body bytes held now, in total and per client address."""

    def __init__(
        self,
        max_connections: int,
        max_client_connections: int,
        max_body_bytes: int,
        max_client_body_bytes: int,
    ) -> None:
        self.max_connections = max_connections
        self.max_client_connections = max_client_connections
        self.max_body_bytes = max_body_bytes
        self.max_client_body_bytes = max_client_body_bytes
        self.connections = 0
        self.body_bytes = 0
        self._conns: dict[str, int] = {}
        self._bodies: dict[str, int] = {}

    def connect(self, addr: str) -> str | None:
        """Admit a connection from ``addr`` (None), or the limit it would pass."""
        if self.connections >= self.max_connections:
            return "max_connections"
        if self._conns.get(addr, 0) >= self.max_client_connections:
            return "client_connections"
        self.connections += 1
        self._conns[addr] = self._conns.get(addr, 0) + 1
        return None

    def disconnect(self, addr: str) -> None:
        self.connections -= 1
        _drop(self._conns, addr, 1)

    def hold_body(self, addr: str, n: int) -> bool:
        """Take ``n`` more body bytes for ``addr`` (True), or refuse them (False)."""
        if self.body_bytes + n > self.max_body_bytes:
            return False
        if self._bodies.get(addr, 0) + n > self.max_client_body_bytes:
            return False
        self.body_bytes += n
        self._bodies[addr] = self._bodies.get(addr, 0) + n
        return True

    def client_body_fits(self, addr: str, n: int) -> bool:
        """``n`` more body bytes stay within ``addr``'s own share (whatever all hold)."""
        return self._bodies.get(addr, 0) + n <= self.max_client_body_bytes

    def free_body(self, addr: str, n: int) -> None:
        if n:
            self.body_bytes -= n
            _drop(self._bodies, addr, n)

    def client_connections(self, addr: str) -> int:
        return self._conns.get(addr, 0)


def _drop(counts: dict[str, int], key: str, n: int) -> None:
    left = counts.get(key, 0) - n
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


def raise_nofile() -> int:
    """Raise the open-file soft limit to the hard limit; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if target > soft:
        with contextlib.suppress(ValueError, OSError):  # not allowed: keep what there is
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def nofile_cap(nofile: int) -> int:
    """The most client connections ``nofile`` descriptors can serve (at least 1)."""
    return max(1, (nofile - RESERVED_FDS) // 2)
