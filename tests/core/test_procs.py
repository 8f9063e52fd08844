"""obs.procs: the one process helper (start, wait ready, log tail, stop, group reaped)."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest

from obs.procs import (
    PORT_HOLD_S,
    ManagedProcess,
    NotReady,
    free_port,
    group_alive,
    http_status,
    port_in_use,
    wait_http,
)

pytestmark = pytest.mark.process

# A leader that leaves a child of its own in its group.
SPAWNER = (
    "import subprocess, time; subprocess.Popen(['sleep', '60']); "
    "print('up', flush=True); time.sleep(60)"
)
# A leader that ignores SIGTERM: stop() must escalate to SIGKILL at its deadline.
STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('up', flush=True); time.sleep(60)"
)


def _started(tmp_path: Path, code: str) -> ManagedProcess:
    proc = ManagedProcess("probe", [sys.executable, "-c", code], log_path=tmp_path / "probe.log")
    proc.start()
    proc.wait_ready(lambda: "up" in proc.log_text(), 20, "it printed up")
    return proc


def test_stop_reaps_the_whole_process_group(tmp_path: Path) -> None:
    """stop() ends the leader and the children it left in its group."""
    proc = _started(tmp_path, SPAWNER)
    pid = proc.pid
    assert group_alive(pid)

    status = proc.stop(timeout_s=5)

    assert status is not None
    assert not group_alive(pid)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert proc.stop() == status  # safe twice


def test_stop_escalates_to_sigkill_when_sigterm_is_ignored(tmp_path: Path) -> None:
    """A leader that ignores SIGTERM is SIGKILLed at the stop deadline."""
    proc = _started(tmp_path, STUBBORN)

    assert proc.stop(timeout_s=0.5) == -9
    assert not group_alive(proc.pid)


def test_kill_takes_the_group_down_at_once(tmp_path: Path) -> None:
    """kill() SIGKILLs leader and children together and reaps them."""
    proc = _started(tmp_path, SPAWNER)

    assert proc.kill() == -9
    assert not group_alive(proc.pid)


def test_wait_ready_reports_an_early_exit_with_the_log_tail(tmp_path: Path) -> None:
    """A process that dies before it is ready raises NotReady naming its status and log."""
    code = "import sys; print('cannot open the model', flush=True); sys.exit(3)"
    proc = ManagedProcess("probe", [sys.executable, "-c", code], log_path=tmp_path / "p.log")
    proc.start()

    with pytest.raises(NotReady, match="exited with status 3") as caught:
        proc.wait_ready(lambda: False, 20, "it was ready")

    assert "cannot open the model" in str(caught.value)
    proc.stop()


def test_wait_ready_times_out_and_leaves_the_process_to_the_caller(tmp_path: Path) -> None:
    """Not ready within the timeout: NotReady says so; the process still runs until stopped."""
    proc = _started(tmp_path, SPAWNER)

    with pytest.raises(NotReady, match=r"was not ready \(never\) within 0 s"):
        proc.wait_ready(lambda: False, 0.2, "never")

    assert proc.poll() is None
    proc.stop(timeout_s=5)


def test_log_tail_keeps_the_last_lines(tmp_path: Path) -> None:
    """log_tail(n) is the last n lines of the log; no log reads as ''."""
    code = "print('\\n'.join(str(i) for i in range(100)), flush=True)"
    proc = ManagedProcess("probe", [sys.executable, "-c", code], log_path=tmp_path / "p.log")
    proc.start()
    assert proc.popen is not None and proc.popen.wait(20) == 0

    assert proc.log_tail(3) == "97\n98\n99"
    assert ManagedProcess("quiet", ["true"]).log_tail() == ""
    proc.stop()


def test_free_port_is_bindable_and_port_in_use_sees_a_listener() -> None:
    """free_port gives a port nothing listens on; port_in_use is True once one does."""
    port = free_port()
    assert not port_in_use(port)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        assert port_in_use(port)


def test_wait_http_and_http_status_against_nothing(tmp_path: Path) -> None:
    """Nothing listening: http_status is None and wait_http times out."""
    url = f"http://127.0.0.1:{free_port()}/health"
    assert http_status(url) is None
    with pytest.raises(TimeoutError):
        wait_http(url, timeout_s=0.3)


def test_free_port_never_hands_out_a_port_twice_within_the_hold(tmp_path: Path) -> None:
    """500 ports asked in a row are 500 ports: the kernel alone repeats one (about 9 repeats
    expected among its ~14,000 odd ports), the ledger does not."""
    ledger = tmp_path / "ports"
    ports = [free_port(ledger_path=ledger) for _ in range(500)]
    assert len(set(ports)) == len(ports)
    assert len(ledger.read_text().splitlines()) == len(ports)


def test_free_port_forgets_old_and_unreadable_ledger_lines(tmp_path: Path) -> None:
    """Ports held longer than PORT_HOLD_S, future stamps and lines that do not parse leave
    the ledger on the next call; only the new port is held then."""
    ledger = tmp_path / "ports"
    old = time.time() - PORT_HOLD_S - 5
    ledger.write_text(f"4000 {old:.1f}\n4001 {time.time() + 3600:.1f}\nnot a line\n4002\n")
    port = free_port(ledger_path=ledger)
    assert ledger.read_text().split()[0] == str(port)
    assert len(ledger.read_text().splitlines()) == 1
