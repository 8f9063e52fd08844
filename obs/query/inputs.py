"""Find the event files a query reads, and check each JSONL file's last line.

Accepted inputs: JSONL files (plain, rotated like ``events.jsonl.1``, or
compressed ``.gz``/``.zst``), globs (quote them: ``'logs/*.jsonl*'``; ``**``
recurses), directories (their JSONL files, or a Parquet dataset when the
directory holds ``.parquet`` files, e.g. one written by ``query export``),
and single ``.parquet`` files.

A writer that died mid-line leaves a last line without its newline. DuckDB
reads such a line as a malformed row; :func:`truncated_tail` finds it so the
report can say "truncated" rather than "malformed".
"""

from __future__ import annotations

import glob
import gzip
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from obs.errors import InputError

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json", ".log")
CLICKHOUSE_SCHEME = "clickhouse://"
_TAIL_CHUNK = 1 << 16
_MAX_TAIL = 16 << 20


@dataclass(frozen=True, slots=True)
class Inputs:
    """The resolved files, by format, each sorted."""

    jsonl: tuple[str, ...] = ()
    parquet: tuple[str, ...] = ()
    parquet_hive: bool = False  # Parquet files live under key=value directories

    @property
    def files(self) -> tuple[str, ...]:
        return self.jsonl + self.parquet


@dataclass(slots=True)
class _Found:
    jsonl: list[str] = field(default_factory=list)
    parquet: list[str] = field(default_factory=list)


def is_clickhouse(paths: object) -> bool:
    """True when a query's LOG argument is a ``clickhouse://`` URL (read by
    ``obs.query.clickhouse``, imported only then: its HTTP client is not cheap to load)."""
    items = [paths] if isinstance(paths, str) else list(paths)  # type: ignore[call-overload]
    return any(str(p).startswith(CLICKHOUSE_SCHEME) for p in items)


def _is_parquet(path: str) -> bool:
    return path.endswith(".parquet")


def _looks_jsonl(name: str) -> bool:
    base = name.removesuffix(".gz").removesuffix(".zst")
    # Rotated files: events.jsonl.1, events.jsonl.2.gz
    stem, _, tail = base.rpartition(".")
    if tail.isdigit() and stem:
        base = stem
    return base.endswith(JSONL_SUFFIXES)


def _add_dir(found: _Found, d: str) -> None:
    files = sorted(str(p) for p in Path(d).rglob("*") if p.is_file())
    parquet = [f for f in files if _is_parquet(f)]
    if parquet:
        found.parquet.extend(parquet)
        return
    jsonl = [f for f in files if _looks_jsonl(os.path.basename(f))]
    if not jsonl:
        raise InputError(f"{d}: directory holds no .jsonl or .parquet files")
    found.jsonl.extend(jsonl)


def _add_file(found: _Found, f: str) -> None:
    (found.parquet if _is_parquet(f) else found.jsonl).append(f)


def resolve(paths: list[str] | tuple[str, ...] | str) -> Inputs:
    """Expand files, globs and directories into the list of event files to read."""
    if isinstance(paths, str | os.PathLike):
        paths = [str(paths)]
    if not paths:
        raise InputError("no event log given: pass JSONL files, globs or a Parquet dataset")
    found = _Found()
    for raw in paths:
        p = str(raw)
        if any(c in p for c in "*?["):
            matches = sorted(glob.glob(p, recursive=True))
            if not matches:
                raise InputError(f"{p}: the pattern matches no file")
            for m in matches:
                if os.path.isdir(m):
                    _add_dir(found, m)
                else:
                    _add_file(found, m)
        elif os.path.isdir(p):
            _add_dir(found, p)
        elif os.path.isfile(p):
            _add_file(found, p)
        else:
            raise InputError(f"{p}: no such file or directory")
    jsonl = tuple(dict.fromkeys(os.path.abspath(f) for f in found.jsonl))
    parquet = tuple(dict.fromkeys(os.path.abspath(f) for f in found.parquet))
    hive = any("=" in part for f in parquet for part in Path(f).parent.parts)
    return Inputs(jsonl, parquet, hive)


def _last_line_plain(path: str) -> bytes | None:
    """The bytes after the last newline, or None when the file ends with one."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        end = f.tell()
        if end == 0:
            return None
        f.seek(end - 1)
        if f.read(1) == b"\n":
            return None
        pos, tail = end, b""
        while pos > 0 and len(tail) < _MAX_TAIL:
            step = min(_TAIL_CHUNK, pos)
            pos -= step
            f.seek(pos)
            tail = f.read(step) + tail
            nl = tail.rfind(b"\n")
            if nl >= 0:
                return tail[nl + 1 :]
        return tail


def _last_line_gzip(path: str) -> bytes | None:
    """Decompress the whole stream (gzip has no index) and keep only its last line."""
    tail = b""
    try:
        with gzip.open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                nl = chunk.rfind(b"\n")
                tail = chunk[nl + 1 :] if nl >= 0 else (tail + chunk)[-_MAX_TAIL:]
    except (OSError, EOFError, zlib.error):
        return None  # a damaged stream: DuckDB reports it when it reads the file
    return tail or None


def truncated_tail(path: str) -> bool:
    """True when the file's last line has no newline and is not a complete JSON object."""
    if path.endswith(".zst"):
        return False  # no zstd decoder in the core; such a line counts as malformed
    line = _last_line_gzip(path) if path.endswith(".gz") else _last_line_plain(path)
    if line is None or not line.strip():
        return False
    try:
        return not isinstance(orjson.loads(line), dict)
    except orjson.JSONDecodeError:
        return True
