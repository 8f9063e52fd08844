"""A real ``redis-server`` (Debian's) on 127.0.0.1 and a free port, for the rate-limit tests:
no disk persistence, started in a temporary directory and stopped by its PID."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

from obs.procs import ManagedProcess, free_port

HOST = "127.0.0.1"


def answers_ping(port: int) -> bool:
    """Whether a Redis server on the port answers PING with PONG."""
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server process: ``url`` for the config, ``stop`` by PID."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        binary = shutil.which("redis-server")
        assert binary is not None, "redis-server not installed"
        self.proc = ManagedProcess(
            "redis-server",
            [
                binary, "--bind", HOST, "--port", str(self.port), "--save", "",
                "--appendonly", "no", "--dir", str(workdir), "--protected-mode", "yes",
            ],
            log_path=workdir / "redis.log",
        )  # fmt: skip

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def start(self) -> RedisServer:
        self.proc.start()
        self.proc.wait_ready(lambda: answers_ping(self.port), 20, "redis answered PING")
        return self

    def stop(self) -> None:
        self.proc.stop()
