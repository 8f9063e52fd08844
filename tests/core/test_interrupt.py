"""The interruptible runner of the demo and the sweep, on real signals to this process."""

from __future__ import annotations

import os
import signal
import time

import pytest

from obs.interrupt import Interrupted, Interruptible


def _deliver(sig: signal.Signals) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.05)  # let the interpreter run the handler on this (the main) thread


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_raises_then_repeats_only_notify_then_handlers_come_back(
    sig: signal.Signals,
) -> None:
    """Inside the block a signal raises Interrupted; after stopping() it only calls on_repeat."""
    repeats: list[str] = []
    before = signal.getsignal(sig)
    with Interruptible(lambda: repeats.append("again")) as signals:
        with pytest.raises(Interrupted) as caught:
            _deliver(sig)
        signals.stopping()
        _deliver(sig)
        _deliver(sig)
    assert caught.value.signum == sig and str(caught.value) == sig.name
    assert repeats == ["again", "again"]
    assert signal.getsignal(sig) is before


def test_arm_restores_raising_after_an_event_loop_took_the_signals() -> None:
    """An asyncio.run with its own handlers leaves the default ones; arm() makes signals raise."""
    with Interruptible(lambda: None) as signals:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # what a finished event loop may leave
        signals.arm()
        with pytest.raises(Interrupted):
            _deliver(signal.SIGTERM)
