"""The client-side record: one JSON line per request the load generator sent.

Flat, like the sidecar's event, and with the event's names where both measure
the same thing (``request_id``, ``ts``, ``ttft_ms``, ``completion_tokens``,
``itl_*_ms``, ``e2e_ms``, ``http_status``, ``finish_reason``), so the two join on
``request_id`` and compare column by column. Times are the client's view:
measured from just before the request is sent, on a monotonic clock, to when the
client *read* the bytes (for a slow reader, when it got round to reading them).

Bump ``SCHEMA_VERSION`` on any change that renames or retypes a field.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import orjson

from obs.errors import InputError

SCHEMA_VERSION = 1


def _f(doc: str, default: Any = None) -> Any:
    return field(default=default, metadata={"doc": doc})


@dataclass(slots=True)
class Record:
    """One request as the load generator saw it. ``to_json`` gives the JSONL line."""

    schema_version: int = _f("Record schema version (this document: 1).", SCHEMA_VERSION)
    run_id: str = _f("Id of the load run; request ids start with it.", "")
    request_id: str = _f("The `X-Request-Id` sent: `<run_id>-<index>`.", "")
    client_class: str = _f("Request class: chat, rag, long-prefill, agent, batch, slow-stream.", "")
    index: int = _f("Position in the plan (0-based).", 0)
    session: int = _f("Session number; an agent conversation is one session.", 0)
    turn: int = _f("Turn within the session (0-based).", 0)
    client: str | None = _f(
        "Simulated client the request was sent as (`--clients`): an opaque id, also its API "
        "key; null when every request shares one identity."
    )
    ts: str = _f("Wall-clock time the request was sent, ISO 8601 UTC, ms precision.", "")
    offset_s: float = _f("When it was sent, seconds after the run started (monotonic).", 0.0)
    planned_offset_s: float = _f(
        "When the plan said to send it (open loop; agent turns add their waits). "
        "offset_s - planned_offset_s is the generator's own lag.",
        0.0,
    )
    model: str = _f("Model asked for.", "")
    stream: bool = _f("Whether the answer was streamed.", True)
    prompt_tokens_planned: int = _f("Planned prompt length in tokens (all messages).", 0)
    max_tokens: int = _f("max_tokens asked for.", 0)
    status: str = _f(
        "Outcome: ok, or error (HTTP error, connection failure, timeout, bad stream).", "ok"
    )
    http_status: int | None = _f("HTTP status received; null when no response arrived.")
    error: str | None = _f("What went wrong (type and message; the server's error message).")
    ttft_ms: float | None = _f(
        "Time to first token: sent to the first chunk carrying a token read. Null if not streamed."
    )
    itl_p50_ms: float | None = _f("Median gap between output chunks as read.")
    itl_p95_ms: float | None = _f("95th percentile of those gaps (nearest rank).")
    itl_max_ms: float | None = _f("Largest of those gaps.")
    tpot_ms: float | None = _f("(last - first output chunk read) / (completion_tokens - 1).")
    e2e_ms: float = _f("Sent to the last byte read.", 0.0)
    completion_tokens: int | None = _f("Output tokens: from usage, else output chunks counted.")
    tokens_source: str | None = _f("Where completion_tokens came from: usage or chunks.")
    prompt_tokens: int | None = _f("Prompt tokens, from usage.")
    cached_tokens: int | None = _f("Prompt tokens served from the prefix cache, from usage.")
    output_chunks: int = _f("Streamed chunks that carried output.", 0)
    finish_reason: str | None = _f("Finish reason of the first choice.")
    bytes_received: int = _f("Response body bytes read.", 0)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to_json(self) -> bytes:
        """One JSONL line, newline included."""
        return orjson.dumps(self.to_dict(), option=orjson.OPT_APPEND_NEWLINE)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Record:
        """A record from a parsed line; unknown keys (a newer schema's additions) are ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def field_docs() -> list[tuple[str, str, str]]:
    """(name, type, description) of every record field, in schema order."""
    return [(f.name, str(f.type), f.metadata["doc"]) for f in fields(Record)]


class RecordWriter:
    """Writes records to a JSONL file (truncated first), one flushed line each."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file: IO[bytes] | None = None

    def __enter__(self) -> RecordWriter:
        try:
            self._file = self.path.open("wb")
        except OSError as e:
            raise InputError(f"{self.path}: cannot write records: {e.strerror or e}") from e
        return self

    def write(self, record: Record) -> None:
        assert self._file is not None, "use RecordWriter as a context manager"
        self._file.write(record.to_json())
        self._file.flush()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSONL file; blank lines skipped, bad lines an error naming the line."""
    p = Path(path)
    try:
        f = p.open("rb")
    except OSError as e:
        raise InputError(f"{p}: cannot read: {e.strerror or e}") from e
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                if not line.endswith(b"\n"):
                    return  # a last line still being written
                raise InputError(f"{p}:{n}: not valid JSON: {e}") from e
            if not isinstance(obj, dict):
                raise InputError(f"{p}:{n}: expected a JSON object per line")
            yield obj


def read_records(path: str | Path) -> list[Record]:
    """Every record in a records file."""
    return [Record.from_dict(obj) for obj in read_jsonl(path)]
