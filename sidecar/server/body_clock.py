"""``BodyClock``: how a request body is arriving, on the event loop's clock.

A connection reading a body keeps when its head ended, when its last byte came, how many
bytes came and its whole deadline (``Limits.body_timeout_s``). From these: the next
deadline its timer is armed for (the whole one, or ``body_idle_timeout_s`` after the last
byte: nginx's ``client_body_timeout`` per read), whether it is a slow client at the
connection cap (``stalled``) and its rate, which body memory sheds the slowest of. Pure:
every time is passed in (the loop's ``time()``), so a test drives it in virtual time.
"""

from __future__ import annotations

from obs.sidecar.server.limits import Limits


class BodyClock:
    """The body a connection is reading: began, last byte at, bytes, whole deadline."""

    __slots__ = ("at", "began", "got", "until")

    def __init__(self) -> None:
        self.began = self.at = self.until = 0.0
        self.got = 0

    def start(self, now: float, limits: Limits) -> None:
        """Its head has ended at ``now``."""
        self.began = self.at = now
        self.until = now + limits.body_timeout_s
        self.got = 0

    def progress(self, n: int, now: float) -> None:
        """``n`` more bytes came at ``now``."""
        self.got += n
        self.at = now

    def resume(self, now: float, limits: Limits) -> None:
        """Reading starts again at ``now`` after the app held it: its time starts anew."""
        self.at = now
        self.until = max(self.until, now + limits.body_timeout_s)

    def deadline(self, limits: Limits) -> float:
        """When it expires: its whole deadline, or ``body_idle_timeout_s`` after its last byte."""
        return min(self.until, self.at + limits.body_idle_timeout_s)

    def rate(self, now: float) -> float:
        """Bytes a second since its head."""
        return self.got / max(now - self.began, 1e-6)

    def stalled(self, limits: Limits, now: float) -> bool:
        """A slow client at ``now``: no byte for ``body_stall_s``, or on average slower than
        ``min_body_rate`` once ``body_stall_s`` has passed."""
        return body_stalled(limits, self.began, self.at, self.got, now)


def body_stalled(limits: Limits, began: float, last: float, got: int, now: float) -> bool:
    """A body read since ``began``, ``got`` bytes so far, the last at ``last``, is a slow
    client at ``now`` (see ``BodyClock.stalled``)."""
    if now - last >= limits.body_stall_s:
        return True
    took = now - began
    return took >= limits.body_stall_s and got < limits.min_body_rate * took
