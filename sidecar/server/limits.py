"""What one client connection may do (``Limits``): enforced by ``obs.sidecar.server.guard``."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class Limits:
    """What one client connection may do; each has a ``vllm-obs sidecar`` flag."""

    max_request_line: int = 8 << 10  # bytes of method, target and version
    max_header_bytes: int = 64 << 10  # bytes of the request line and headers together
    max_headers: int = 100
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    # A body with no new byte for this long is closed (408), as nginx's client_body_timeout
    # (per read); at the connection cap, one with no byte for ``body_stall_s`` or slower than
    # ``min_body_rate`` (bytes/s, averaged since its head) is evicted for a newcomer.
    body_idle_timeout_s: float = 10.0
    body_stall_s: float = 2.0
    min_body_rate: int = 1024
    idle_timeout_s: float = 5.0  # as vLLM's server (uvicorn) keeps an idle connection
    max_connections: int = 2048  # lowered at start to what the open-file limit allows
    max_client_connections: int | None = None  # one address's; None: a quarter of the above
    max_body_memory: int = 256 << 20  # bytes of request bodies held at once, all clients
    max_client_body_memory: int | None = None  # one address's; None: a quarter of the above

    @property
    def client_connections(self) -> int:
        """Connections one client address may hold."""
        if self.max_client_connections is not None:
            return min(self.max_client_connections, self.max_connections)
        return max(1, self.max_connections // 4)

    @property
    def client_body_memory(self) -> int:
        """Body bytes one client address may hold."""
        if self.max_client_body_memory is not None:
            return min(self.max_client_body_memory, self.max_body_memory)
        return max(1, self.max_body_memory // 4)

    def fitted(self, connection_cap: int) -> Limits:
        """These limits with at most ``connection_cap`` connections (the open-file limit's)."""
        if self.max_connections <= connection_cap:
            return self
        return replace(self, max_connections=connection_cap)
