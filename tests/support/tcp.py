"""TCP connections as the kernel lists them (/proc/net/tcp, tcp6): which side closed first.

A server's socket stays ESTABLISHED while the connection is open, goes to CLOSE_WAIT when its
peer closed it and the server has not yet, and then to LAST_ACK, or TIME_WAIT when both
closed at once, or leaves the table. So a test can tell, from the server's side of one
connection, that it was closed and that the server has seen it, without a clock.
"""

from __future__ import annotations

from pathlib import Path

# /proc/net/tcp's hexadecimal states (include/net/tcp_states.h)
STATES = {"01": "ESTABLISHED", "06": "TIME_WAIT", "08": "CLOSE_WAIT", "09": "LAST_ACK"}


def _rows(port: int) -> list[tuple[int, str, int]]:
    """(peer's port, state, bytes received and not yet read) of each connection whose local
    end is ``port``; listening sockets left out."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, state, queues = fields[1], fields[2], fields[3], fields[4]
            if int(local.rsplit(":", 1)[1], 16) != port or state == "0A":  # 0A: LISTEN
                continue
            rx = int(queues.split(":")[1], 16)
            rows.append((int(remote.rsplit(":", 1)[1], 16), state, rx))
    return rows


def unread(port: int, peer: int) -> int | None:
    """Bytes the server on ``port`` has received from ``peer`` (its port) and not read yet;
    None when there is no such connection."""
    for remote, _, rx in _rows(port):
        if remote == peer:
            return rx
    return None


def server_side(port: int) -> dict[int, str]:
    """Each connection whose local end is ``port`` (a listening server's accepted ones), by
    the peer's port: its state's name (the number when unnamed). Listening sockets left out."""
    return {remote: STATES.get(state, state) for remote, state, _ in _rows(port)}


def closed_both_ways(port: int, peers: set[int]) -> bool:
    """Whether one of these connections to ``port`` (by the peer's port) is closed on the
    server's side too: neither ESTABLISHED nor CLOSE_WAIT (the peer closed, the server not
    yet), but closing, TIME_WAIT or gone."""
    now = server_side(port)
    return any(now.get(p, "gone") not in ("ESTABLISHED", "CLOSE_WAIT") for p in peers)
