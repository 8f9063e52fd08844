"""Turns between the whole suite's two pytest-xdist workers (scripts/check).

Most tests may run beside the other worker's. A test marked ``alone`` judges behaviour under
load or within a time (a burst shed, a grace period, a pool held at its target while two
sidecars flood it, every dashboard panel fed within a window), which the other worker's CPU
(a ``vllm serve`` starting, a sweep) would skew: it runs while the other worker waits between
two tests. Two ``flock`` files make the turns, writer first: every test passes through the
gate, then holds the room shared; an ``alone`` test holds the gate, so no new test enters,
and waits for the room to itself.

Both locks are ``flock``s on files of the run (named by xdist's run id): the kernel frees them
when a worker dies, so a crashed worker never leaves the other one waiting.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


class Turns:
    """One worker's side of the turns; ``run_id`` is the same for every worker of a run."""

    def __init__(self, run_id: str, directory: Path | None = None) -> None:
        base = directory or Path(tempfile.gettempdir())
        self._paths = [base / f"vllm-obs-tests-{run_id}.{name}" for name in ("gate", "room")]
        self._gate, self._room = (os.open(p, os.O_RDWR | os.O_CREAT) for p in self._paths)

    @contextlib.contextmanager
    def turn(self, alone: bool) -> Iterator[None]:
        """Hold a turn for one test: the room shared, or (``alone``) to itself."""
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(self._gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self._room, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(self._gate, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close this worker's side; the files go with the first to close (the other keeps
        its open ones, and no third worker comes)."""
        os.close(self._gate)
        os.close(self._room)
        for path in self._paths:
            path.unlink(missing_ok=True)
