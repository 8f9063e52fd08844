"""Event -> ClickHouse ``JSONEachRow`` line: the one place the row shape is decided.

``ts`` becomes ``YYYY-MM-DD hh:mm:ss`` in UTC (what ``DateTime`` parses on
every release) and ``ts_ms`` the same instant in epoch milliseconds. Every
other field goes as it is in the event (booleans as ``true``/``false``, which
``UInt8`` columns accept).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from obs.clickhouse.schema import TS_MS

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def _instant(ts: Any) -> datetime | None:
    if isinstance(ts, datetime):
        return ts if ts.tzinfo else ts.replace(tzinfo=UTC)
    if not isinstance(ts, str) or not ts:
        return None
    try:
        value = datetime.fromisoformat(ts)
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def row(event: dict[str, Any]) -> bytes | None:
    """One JSONEachRow line (newline included), or None when ``ts`` is not a time.

    ``event`` is changed in place (its ``ts``): pass a dict of your own, such as
    ``Event.to_dict()`` returns.
    """
    when = _instant(event.get("ts"))
    if when is None:
        return None
    utc = when.astimezone(UTC)
    event["ts"] = utc.isoformat(sep=" ")[:19]
    event[TS_MS] = (utc - _EPOCH) // _MS
    return orjson.dumps(event, option=orjson.OPT_APPEND_NEWLINE)
