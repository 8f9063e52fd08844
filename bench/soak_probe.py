"""What /proc and /metrics say about a process under soak: memory, descriptors, sockets."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_TCP_STATES = {"01": "ESTABLISHED", "06": "TIME_WAIT", "08": "CLOSE_WAIT", "0A": "LISTEN"}


@dataclass
class Sample:
    t_s: float
    rss_mib: float
    fds: int
    sockets: dict[str, int]
    sent: int
    events: int

    def count(self, peer: str) -> int:
        """Sockets to (or from) ``peer``: ``replica`` (any), ``client``, ``otlp``."""
        return sum(n for k, n in self.sockets.items() if k.startswith(peer) and " " in k)

    @property
    def other_fds(self) -> int:
        """Descriptors besides upstream and client connections: files, pipes, listeners."""
        return self.fds - self.count("replica") - self.count("client")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def socket_states(pid: int, names: dict[int, str] | None = None) -> dict[str, int]:
    """TCP sockets the process holds, by state, and by peer where ``names`` names a port.

    ``names`` maps a port to a name: a socket whose remote (or, for accepted
    connections, local) port is named counts under ``NAME STATE`` too.
    """
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    states: Counter[str] = Counter()
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if path.exists():
            for line in path.read_text().splitlines()[1:]:
                cols = line.split()
                if cols[9] not in inodes:
                    continue
                state = _TCP_STATES.get(cols[3], cols[3])
                states[state] += 1
                local, remote = (int(cols[i].rsplit(":", 1)[1], 16) for i in (1, 2))
                name = (names or {}).get(remote) or (names or {}).get(local)
                if name and state != "LISTEN":
                    states[f"{name} {state}"] += 1
    return dict(states)


def count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    with path.open("rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def sample(
    pid: int, t0: float, records: Path, events: Path, names: dict[int, str] | None = None
) -> Sample:
    return Sample(
        t_s=round(time.monotonic() - t0, 1),
        rss_mib=round(rss_mib(pid), 1),
        fds=len(list(Path(f"/proc/{pid}/fd").iterdir())),
        sockets=socket_states(pid, names),
        sent=count_lines(records),
        events=count_lines(events),
    )


def metric_sum(base_url: str, name: str) -> float:
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def post_chat(base_url: str) -> int:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    req = urllib.request.Request(
        base_url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
