"""Durations and times as people write them: one parser for config, rules, queries and CLIs.

Two grammars, both over the units ``ms s m h d w``:

* **Prometheus durations** (``seconds``): a whole number and one unit, ``5m``,
  ``3d``, ``500ms``; what the lanes config's burn windows and the rule files take.
* **Loose durations** (``parse_duration``): also a decimal and spaces,
  ``1.5h``, ``90 s``; what ``--since 2h`` and ``--rate-interval`` take on the CLI.

``parse_time`` reads an absolute ISO time or a loose duration ago, as naive UTC.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Final

from obs.errors import InputError

UNIT_S: Final = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PROMETHEUS = re.compile(r"^([0-9]+)(ms|s|m|h|d|w)$")
_LOOSE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")


def seconds(duration: str) -> float:
    """A Prometheus duration such as ``5m`` or ``3d``, in seconds; ValueError if it is not one."""
    m = _PROMETHEUS.match(duration)
    if m is None:
        raise ValueError(f"{duration!r} is not a Prometheus duration like 5m, 1h or 3d")
    return int(m.group(1)) * UNIT_S[m.group(2)]


def parse_duration(text: str) -> timedelta:
    """``30m`` -> 30 minutes (decimals and spaces allowed); InputError if it is not one."""
    m = _LOOSE.match(text)
    if not m:
        raise InputError(f"{text!r} is not a duration like 90s, 30m, 2h or 1d")
    return timedelta(seconds=float(m.group(1)) * UNIT_S[m.group(2)])


def parse_time(text: str, now: datetime | None = None) -> datetime:
    """An absolute ISO time or a relative one (``2h`` = two hours before ``now``), naive UTC."""
    text = text.strip()
    if _LOOSE.match(text):
        now = now or datetime.now(UTC)
        return _naive_utc(now) - parse_duration(text)
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00").replace(" ", "T", 1))
    except ValueError:
        raise InputError(
            f"{text!r} is not a time: use ISO 8601 (2025-06-02T14:30, 2025-06-02T14:30:00Z) "
            "or a relative duration (30m, 2h, 1d ago)"
        ) from None
    return _naive_utc(t)


def _naive_utc(t: datetime) -> datetime:
    return t.astimezone(UTC).replace(tzinfo=None) if t.tzinfo else t
