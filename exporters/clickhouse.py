"""ClickHouse exporter: request events inserted in batches from a thread off the event loop.

``export`` appends the event to a bounded deque (no lock, no I/O, no wake-up;
a full deque drops the event and counts it, reason ``queue_full``). A sender
thread wakes every ``flush_interval_s`` (1 s) or as soon as ``batch_rows``
events wait, turns them into ``JSONEachRow`` lines (``obs.clickhouse.rows``)
and inserts them with one HTTP request. When an insert fails (ClickHouse down,
overloaded, refusing) the batch goes to a bounded spool file
(``exporters.spool``), the failure is counted in
``vllm_obs_exporter_failures_total{exporter="clickhouse"}`` (the existing
exporter alert fires on it), and later batches go to the spool too until an
insert succeeds again, retried with exponential backoff (1 s doubling to
``max_backoff_s``). Once ClickHouse is back the spool drains, oldest first,
before new events. Only a full spool loses events: counted as
``vllm_obs_events_dropped_total{exporter="clickhouse",reason="spool_full"}``.

A batch whose insert fails after ClickHouse stored it (the answer was lost) is
sent again; the table's ``ReplacingMergeTree`` and ``FINAL`` reads remove the
duplicate.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

import structlog
from pydantic import ValidationError

from obs.clickhouse.client import INSERT_SETTINGS, ClickHouseError, Client
from obs.clickhouse.rows import row
from obs.config import ClickHouseExport
from obs.errors import ConfigError
from obs.events import Event
from obs.exporters.base import FailureCounter
from obs.exporters.batching import BatchingExporter
from obs.exporters.jsonl import EventCounters
from obs.exporters.spool import Spool
from obs.record import Finished

log = structlog.get_logger("vllm_obs.clickhouse")

NAME = "clickhouse"


class Counters(EventCounters, FailureCounter, Protocol):
    pass


class ClickHouseExporter(BatchingExporter[Event]):
    name = NAME

    def __init__(
        self,
        client: Client,
        table: str,
        spool_path: str | Path,
        *,
        counters: Counters | None = None,
        spool_max_bytes: int = 1 << 30,
        batch_rows: int = 10000,
        flush_interval_s: float = 1.0,
        max_backoff_s: float = 30.0,
        queue_size: int = 200_000,
    ) -> None:
        super().__init__(
            queue_size=queue_size,
            flush_interval_s=flush_interval_s,
            wake_items=batch_rows,
            batch_items=batch_rows,
        )
        self._client = client
        self._table = table
        self._spool = Spool(spool_path, spool_max_bytes)
        self._counters = counters
        self._max_backoff_s = max_backoff_s
        self._backoff_s = 0.0
        self._retry_at = 0.0  # monotonic time of the next insert attempt while failing
        self._start()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Send what waits (or leave it in the spool for the next start)."""
        super().shutdown(timeout_s)
        self._client.close()

    @property
    def spooled_bytes(self) -> int:
        return self._spool.pending_bytes

    # Sender thread.
    def _item(self, finished: Finished) -> Event:
        return finished.event

    def _before_batches(self) -> None:
        self._drain_spool()

    def _write_batch(self, items: list[Event]) -> None:
        lines = [line for e in items if (line := row(e.to_dict())) is not None]
        data = b"".join(lines)
        sent = not self._failing() and self._insert(data, len(lines))
        if not sent:
            kept = self._spool.append(lines)
            if kept < len(lines):
                self._dropped("spool_full", len(lines) - kept)

    def _drain_spool(self) -> None:
        """Send the spool, oldest first, while inserts succeed."""
        while self._spool and not self._failing():
            chunk, n = self._spool.peek(8 << 20)
            if not self._insert(chunk, n):
                return
            self._spool.consume(len(chunk))

    def _failing(self) -> bool:
        """True while in backoff after a failed insert (no attempt until it ends)."""
        return self._backoff_s > 0 and time.monotonic() < self._retry_at and not self._stopping

    def _insert(self, data: bytes, n: int) -> bool:
        if not n:
            return True
        try:
            self._client.insert(self._table, data, INSERT_SETTINGS)
        except ClickHouseError as e:
            if self._backoff_s == 0:
                log.error("clickhouse_insert_failed", table=self._table, error=str(e))
            self._backoff_s = min(max(1.0, self._backoff_s * 2), self._max_backoff_s)
            self._retry_at = time.monotonic() + self._backoff_s
            if self._counters is not None:
                self._counters.exporter_failed(NAME)
            return False
        if self._backoff_s:
            log.info("clickhouse_insert_recovered", table=self._table)
            self._backoff_s = 0.0
        if self._counters is not None:
            self._counters.event_written(NAME, n)
        return True

    def _dropped(self, reason: str, n: int) -> None:
        if self._counters is not None:
            self._counters.event_dropped(NAME, reason, n)


def clickhouse_settings(
    section: ClickHouseExport | None, **flags: str | float | None
) -> ClickHouseExport | None:
    """The config file's ``clickhouse:`` section with the command line's values over it
    (None: the exporter is off)."""
    given = {k: v for k, v in flags.items() if v is not None}
    merged = {**(section.model_dump() if section else {}), **given}
    if not merged.get("url"):
        if given:
            raise ConfigError("--clickhouse-table/--clickhouse-spool need --clickhouse-url")
        return None
    try:
        return ClickHouseExport.model_validate(merged)
    except ValidationError as e:
        err = e.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else "url"
        raise ConfigError(
            f"--clickhouse-{name.replace('_', '-')} (or clickhouse.{name} in the config): "
            f"{err['input']!r}: {err['msg']}"
        ) from None


def start_exporter(
    settings: ClickHouseExport,
    events_path: Path | None,
    worker: int,
    counters: Counters | None,
) -> ClickHouseExporter:
    """Check the table once, then start the exporter; bad settings raise a one-line error.

    Wrong credentials, a missing table or one with the wrong schema stop the
    sidecar at start (ConfigError). An unreachable server does not: it is
    logged, and events wait in the spool until it answers.
    """
    from obs.clickhouse.client import Credentials, split_table
    from obs.clickhouse.schema import TableSpec, check

    db, table = split_table(settings.table, "--clickhouse-table")
    client = Client(settings.url, Credentials.from_env(), timeout_s=10.0)
    try:
        missing = check(client, TableSpec(db, table))
        if missing:
            log.warning("clickhouse_columns_missing", table=settings.table, columns=missing)
    except ClickHouseError as e:
        if not e.retryable:
            client.close()
            raise ConfigError(f"--clickhouse-url: {e}") from None
        log.warning("clickhouse_unreachable_at_start", error=str(e), spooling=True)
    spool = Path(settings.spool) if settings.spool else _default_spool(events_path)
    if worker:
        spool = spool.with_name(f"{spool.stem}.w{worker}{spool.suffix}")
    return ClickHouseExporter(
        client,
        settings.table,
        spool,
        counters=counters,
        spool_max_bytes=int(settings.spool_max_mb * (1 << 20)),
    )


def _default_spool(events_path: Path | None) -> Path:
    parent = events_path.parent if events_path is not None else Path()
    return parent / "clickhouse-spool.jsonl"
