"""The whole suite's turns between two workers (tests/support/worker_turns.py): an ``alone``
test runs with no other test, and a waiting ``alone`` test is not overtaken.

Each ``Turns`` opens its own files, and ``flock`` locks belong to an open file, so three
instances in three threads contend as three workers' would. The short sleeps only give a
wrong lock the chance to let a thread in early; the assertions are on the order of events."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tests.support.worker_turns import Turns

SETTLE_S = 0.2  # long enough for a thread to reach its flock


def _run(turns: Turns, alone: bool, name: str, log: list[str], hold: threading.Event) -> None:
    with turns.turn(alone):
        log.append(f"{name} in")
        hold.wait(10)
        log.append(f"{name} out")


def _start(
    turns: Turns, alone: bool, name: str, log: list[str]
) -> tuple[threading.Thread, threading.Event]:
    hold = threading.Event()
    thread = threading.Thread(target=_run, args=(turns, alone, name, log, hold), daemon=True)
    thread.start()
    time.sleep(SETTLE_S)
    return thread, hold


def test_an_alone_turn_waits_for_a_running_test_and_is_not_overtaken(tmp_path: Path) -> None:
    """An alone test waits for the running test to end; a test asking after it goes after it."""
    workers = [Turns("run", tmp_path) for _ in range(3)]
    log: list[str] = []
    first, hold_first = _start(workers[0], False, "shared", log)
    lone, hold_lone = _start(workers[1], True, "alone", log)
    late, hold_late = _start(workers[2], False, "late", log)
    assert log == ["shared in"]
    hold_first.set()
    first.join(5)
    time.sleep(SETTLE_S)
    assert log == ["shared in", "shared out", "alone in"]
    hold_lone.set()
    hold_late.set()
    for thread in (lone, late):
        thread.join(5)
    assert log == ["shared in", "shared out", "alone in", "alone out", "late in", "late out"]
    for turns in workers:
        turns.close()


def test_shared_turns_run_together(tmp_path: Path) -> None:
    """Two tests not marked alone hold the room at the same time."""
    workers = [Turns("run", tmp_path) for _ in range(2)]
    log: list[str] = []
    a, hold_a = _start(workers[0], False, "a", log)
    b, hold_b = _start(workers[1], False, "b", log)
    assert log == ["a in", "b in"]
    hold_a.set()
    hold_b.set()
    a.join(5)
    b.join(5)
    for turns in workers:
        turns.close()
    assert not list(tmp_path.iterdir())  # the run's lock files go with the workers
