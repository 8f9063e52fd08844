"""One interruptible runner: how a command that starts processes stops on Ctrl-C or SIGTERM.

The demo and the sweep start servers, then run for minutes. While they run, SIGINT and
SIGTERM raise :class:`Interrupted` wherever the main thread is (a BaseException, so no
``except Exception`` on the way, such as a loop waiting for a server to answer, can
swallow it). Once the command is stopping what it started, a second signal must not cut
that short: it only calls the command's ``on_repeat`` (a line saying it is still
stopping). On the way out the handlers the command found are put back.

    with Interruptible(lambda: say("still stopping ...")) as signals:
        try:
            run()                  # an asyncio.run inside removes them: signals.arm() after
        except Interrupted as e:
            status = 128 + e.signum
        finally:
            signals.stopping()
            stop_everything()
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived: stop everything and leave (exit status 128 + ``signum``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


class Interruptible:
    """Signals raise :class:`Interrupted` inside the block; :meth:`stopping` turns them into
    ``on_repeat`` calls; the previous handlers come back when the block ends."""

    def __init__(self, on_repeat: Callable[[], None]) -> None:
        self._on_repeat = on_repeat
        self._previous: dict[signal.Signals, Any] = {}

    def __enter__(self) -> Interruptible:
        self._previous = {s: signal.getsignal(s) for s in SIGNALS}
        self.arm()
        return self

    def arm(self) -> None:
        """(Re)install the handlers that raise: at the start, and after an event loop that
        installed its own (``loop.add_signal_handler``) removed them."""
        for s in SIGNALS:
            signal.signal(s, _raise_interrupted)

    def stopping(self) -> None:
        """From now on a signal does not interrupt: the clean-up runs to its end."""
        for s in SIGNALS:
            signal.signal(s, self._repeat)

    def _repeat(self, signum: int, frame: FrameType | None) -> None:
        self._on_repeat()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
