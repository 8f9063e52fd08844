"""Child processes on loopback: start, wait until ready, log tail, stop; the group always reaped.

Low in the layers (the standard library and ``requests``, the project's one synchronous
HTTP client, never through a configured proxy: every server here is on loopback). The
engine servers, the demo's Prometheus and Alertmanager, the sidecar test process,
ClickHouse and the benchmark servers all run through :class:`ManagedProcess`. A child
runs in its own session (process group), so a Ctrl-C in the caller's terminal does not
reach it directly, and stopping it also reaches whatever it spawned (vLLM's engine core,
the sidecar's workers): :meth:`ManagedProcess.stop` sends SIGTERM to the leader, waits,
SIGKILLs the group at the deadline, and waits for every process of the group to be gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

import requests

HOST = "127.0.0.1"
POLL_INTERVAL_S = 0.1
REAP_GRACE_S = 5.0
LOG_TAIL_LINES = 40


class NotReady(RuntimeError):
    """The process exited, or did not become ready in time; the message carries the log tail."""


# A port chosen by ``free_port`` stays free until its server binds it, ~20 s later for a
# ``vllm serve``; meanwhile the kernel may hand the same port to another process that asks
# (the test suite's second worker, a second demo). Ports handed out in the last
# ``PORT_HOLD_S`` by any process of this user are kept in a ledger file and not handed out again.
PORT_HOLD_S = 120.0
PORT_LEDGER = Path(tempfile.gettempdir()) / f"vllm-obs-ports-{os.getuid()}"


def free_port(host: str = HOST, ledger_path: Path = PORT_LEDGER) -> int:
    """A TCP port that is free on ``host`` right now and not handed out by another call (of
    any process of this user) in the last ``PORT_HOLD_S`` seconds."""
    try:
        fd = os.open(ledger_path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:  # no ledger (a read-only temp directory): the kernel's choice alone
        return _kernel_port(host)
    with os.fdopen(fd, "r+") as ledger:
        fcntl.flock(ledger, fcntl.LOCK_EX)  # released when the file closes
        now = time.time()
        held = _held_ports(ledger.read(), now)
        port = _kernel_port(host)
        for _ in range(64):
            if port not in held:
                break
            port = _kernel_port(host)
        held[port] = now
        ledger.seek(0)
        ledger.truncate()
        ledger.write("".join(f"{p} {t:.1f}\n" for p, t in held.items()))
    return port


def _held_ports(text: str, now: float) -> dict[int, float]:
    """The ledger's ports still held at ``now``; a line that does not parse is dropped."""
    held: dict[int, float] = {}
    for line in text.splitlines():
        parts = line.split()
        with contextlib.suppress(ValueError, IndexError):
            port, at = int(parts[0]), float(parts[1])
            if now - PORT_HOLD_S <= at <= now + 1:
                held[port] = at
    return held


def _kernel_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def port_in_use(port: int, host: str = HOST) -> bool:
    """True if something accepts TCP connections on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) == 0


def http_status(url: str, timeout_s: float = 2.0) -> int | None:
    """Status of ``GET url``, never through a configured proxy; None when nothing answers."""
    with loopback_session() as session:
        try:
            return session.get(url, timeout=timeout_s).status_code
        except requests.RequestException:
            return None


def loopback_session() -> requests.Session:
    """A ``requests`` session that ignores proxy settings from the environment."""
    session = requests.Session()
    session.trust_env = False
    return session


def group_alive(pgid: int) -> bool:
    """True if any non-zombie process is still in process group ``pgid``."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After the command name: state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to process group ``pgid``; nothing if the group is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def reap_group(pgid: int, deadline: float) -> None:
    """Wait for group ``pgid`` to be empty; SIGKILL what is left at ``deadline`` (monotonic)."""
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if group_alive(pgid):
        signal_group(pgid, signal.SIGKILL)
        give_up = time.monotonic() + REAP_GRACE_S
        while group_alive(pgid) and time.monotonic() < give_up:
            time.sleep(0.05)


def read_tail(path: Path | None, chars: int) -> str:
    """The last ``chars`` characters of the file at ``path`` ('' if there is none)."""
    if path is None:
        return ""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - chars * 4))
            return f.read().decode(errors="replace")[-chars:]
    except OSError:
        return ""


def tail_lines(path: Path | None, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of the file at ``path`` ('' if there is none)."""
    return "\n".join(read_tail(path, 1 << 20).splitlines()[-lines:])


class Exited(RuntimeError):
    """The process exited while it was being waited on."""

    def __init__(self, status: int, what: str) -> None:
        super().__init__(f"process exited with {status} before {what}")
        self.status = status


def poll_until(
    ready: Callable[[], bool],
    timeout_s: float,
    what: str,
    proc: subprocess.Popen[bytes] | None = None,
    interval_s: float = POLL_INTERVAL_S,
) -> float:
    """Poll ``ready`` every ``interval_s`` until it holds; seconds it took.

    Raises :class:`Exited` if ``proc`` exits first, ``TimeoutError`` after ``timeout_s``.
    """
    started = time.monotonic()
    while True:
        if proc is not None and proc.poll() is not None:
            raise Exited(proc.returncode, what)
        if ready():
            return time.monotonic() - started
        if time.monotonic() - started >= timeout_s:
            raise TimeoutError(f"not {what} within {timeout_s:.0f} s")
        time.sleep(interval_s)


def wait_http(
    url: str,
    timeout_s: float = 30.0,
    proc: subprocess.Popen[bytes] | None = None,
    interval_s: float = POLL_INTERVAL_S,
) -> None:
    """Poll ``url`` until it answers 2xx; ``Exited`` (a RuntimeError) or ``TimeoutError``."""
    poll_until(lambda: _ok(http_status(url)), timeout_s, f"{url} answered", proc, interval_s)


class ManagedProcess:
    """One command in its own session, logging stdout and stderr to ``log_path`` (or nowhere)."""

    def __init__(
        self,
        name: str,
        cmd: Sequence[str],
        *,
        log_path: Path | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        append_log: bool = False,
    ) -> None:
        self.name = name
        self.cmd = list(cmd)
        self.log_path = log_path
        self.env = None if env is None else dict(env)
        self.cwd = cwd
        self.append_log = append_log
        self.popen: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        """PID of the leader, also the process-group id."""
        if self.popen is None:
            raise RuntimeError(f"{self.name} not started")
        return self.popen.pid

    def start(self) -> subprocess.Popen[bytes]:
        """Launch; raises ``OSError`` when the command cannot run (the log is closed then)."""
        out: IO[bytes] | int = subprocess.DEVNULL
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.log_path.open("ab" if self.append_log else "wb")
            out = self._log
        try:
            self.popen = subprocess.Popen(
                self.cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        except OSError:
            self._close_log()
            raise
        return self.popen

    def wait_ready(self, ready: Callable[[], bool], timeout_s: float, what: str) -> float:
        """Poll ``ready`` until it holds; seconds it took. Raises :class:`NotReady` with the log
        tail if the process exits or ``timeout_s`` passes (the process is left running)."""
        assert self.popen is not None, "start() first"
        try:
            return poll_until(ready, timeout_s, what, self.popen)
        except Exited as exc:
            raise NotReady(
                f"{self.name} exited with status {exc.status} before {what}.\n{self._tail_note()}"
            ) from None
        except TimeoutError:
            raise NotReady(
                f"{self.name} was not ready ({what}) within {timeout_s:.0f} s.\n{self._tail_note()}"
            ) from None

    def wait_http(self, url: str, timeout_s: float) -> float:
        """:meth:`wait_ready` for ``GET url`` answering 2xx."""
        return self.wait_ready(lambda: _ok(http_status(url)), timeout_s, f"{url} answered")

    def poll(self) -> int | None:
        """Exit status if the leader has exited, else None (None too before start)."""
        return None if self.popen is None else self.popen.poll()

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM the leader, wait up to ``timeout_s``, then SIGKILL the group; reap the group.

        The leader gets SIGTERM alone first (a server shuts its own children down;
        signalling the whole group at once can kill them under it); what is left of the
        group afterwards gets SIGTERM, then SIGKILL at the deadline. Returns the leader's
        exit status (None if never started). Safe to call twice.
        """
        proc = self.popen
        if proc is None:
            return None
        deadline = time.monotonic() + timeout_s
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            signal_group(proc.pid, signal.SIGCONT)  # a paused process cannot act on SIGTERM
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        signal_group(proc.pid, signal.SIGTERM)  # stragglers, if any
        reap_group(proc.pid, deadline)
        self._close_log()
        return proc.returncode

    def kill(self, timeout_s: float = 60.0) -> int | None:
        """SIGKILL the whole group at once (a crash, for fault tests) and reap it.

        The wait is long: on a loaded machine a killed process that was writing to
        disk can take seconds to be reaped.
        """
        proc = self.popen
        if proc is None:
            return None
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait(timeout_s)
        reap_group(proc.pid, time.monotonic() + REAP_GRACE_S)
        self._close_log()
        return proc.returncode

    def log_text(self, chars: int = 1 << 20) -> str:
        """The last ``chars`` characters of the log ('' if there is none)."""
        return read_tail(self.log_path, chars)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the log ('' if there is none)."""
        return tail_lines(self.log_path, lines)

    def _tail_note(self) -> str:
        if self.log_path is None:
            return "(no log)"
        return f"Log ({self.log_path}), last lines:\n{self.log_tail()}"

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def _ok(status: int | None) -> bool:
    return status is not None and 200 <= status < 300
