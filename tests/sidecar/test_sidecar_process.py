"""``SidecarProcess``: how a start on a port another process holds ends."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from obs.sidecar.process import SidecarProcess

pytestmark = pytest.mark.process


def test_a_given_port_in_use_fails_the_start_and_is_never_moved(tmp_path: Path) -> None:
    """A port the caller gave, held by another socket: the start fails naming it in use,
    and the sidecar stays on that port (only a port it chose itself is chosen again)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        sc = SidecarProcess(
            upstream="http://127.0.0.1:9", port=port, log_path=tmp_path / "sidecar.log"
        )
        with pytest.raises(RuntimeError, match="address already in use"):
            sc.start(timeout_s=10)
        assert sc.port == port
        assert sc.url == f"http://127.0.0.1:{port}"
