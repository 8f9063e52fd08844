"""What one client connection may do (``Limits``): enforced by ``obs.sidecar.guard``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Limits:
    """What one client connection may do; each has a ``vllm-obs sidecar`` flag."""

    max_request_line: int = 8 << 10  # bytes of method, target and version
    max_header_bytes: int = 64 << 10  # bytes of the request line and headers together
    max_headers: int = 100
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    idle_timeout_s: float = 5.0  # uvicorn's keep-alive default
    max_connections: int = 2048
