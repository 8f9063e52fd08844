"""A small ClickHouse client over the HTTP interface (``requests``), and its URLs.

ClickHouse's HTTP interface takes a query in the body (or ``query=`` plus the
rows in the body for an INSERT) and answers with the result or a status >= 400
and a ``Code: N ... DB::Exception: MESSAGE`` text. That is all this toolkit
needs, and it works unchanged from 18.16 (Debian's package) to current
releases; no client library speaks to both.

Credentials come from the environment, never from a command-line value that
``ps`` shows: ``CLICKHOUSE_USER`` (default ``default``) and
``CLICKHOUSE_PASSWORD``, or ``CLICKHOUSE_PASSWORD_FILE`` naming a file whose
first line is the password. They travel as HTTP basic auth and are never
logged or put in an error message.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

import orjson
import requests

from obs.errors import ConfigError, ObsError

USER_ENV = "CLICKHOUSE_USER"
PASSWORD_ENV = "CLICKHOUSE_PASSWORD"
PASSWORD_FILE_ENV = "CLICKHOUSE_PASSWORD_FILE"
DEFAULT_PORT = 8123
# ClickHouse ignores fields its table lacks (a vllm-obs newer than the table's schema).
INSERT_SETTINGS: Final = {"input_format_skip_unknown_fields": 1}
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ClickHouseError(ObsError):
    """ClickHouse refused a request or could not be reached (one line, no credentials)."""

    def __init__(self, message: str, *, status: int | None = None, code: int | None = None):
        super().__init__(message)
        self.status = status  # HTTP status; None when the server was not reached
        self.code = code  # ClickHouse error code, when it sent one

    @property
    def retryable(self) -> bool:
        """Worth retrying later: unreachable, overloaded, or a server-side failure."""
        return self.status is None or (self.status >= 500 and self.code not in _PERMANENT)


# Errors no retry cures: unknown table/database/column, type mismatch, syntax.
_PERMANENT = frozenset({16, 27, 36, 47, 53, 60, 62, 81, 117, 192, 193, 516})


@dataclass(frozen=True, slots=True)
class Credentials:
    user: str = "default"
    password: str = field(default="", repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Credentials:
        """From ``CLICKHOUSE_USER`` and ``CLICKHOUSE_PASSWORD`` or ``CLICKHOUSE_PASSWORD_FILE``."""
        env = os.environ if env is None else env
        password = env.get(PASSWORD_ENV, "")
        path = env.get(PASSWORD_FILE_ENV)
        if path and not password:
            try:
                with open(path, encoding="utf-8") as f:
                    password = f.readline().rstrip("\r\n")
            except OSError as e:
                raise ConfigError(f"{PASSWORD_FILE_ENV}: cannot read {path}: {e.strerror}") from e
        return cls(env.get(USER_ENV) or "default", password)


def split_table(value: str, flag: str = "--table") -> tuple[str, str]:
    """``DB.TABLE`` -> (db, table), both plain identifiers."""
    db, sep, table = value.partition(".")
    if not sep or not _IDENT.match(db) or not _IDENT.match(table):
        raise ConfigError(f"{flag}: {value!r} is not DB.TABLE (letters, digits, _)")
    return db, table


def base_url(url: str, flag: str = "--clickhouse-url") -> str:
    """``http(s)://HOST[:PORT]`` (or ``clickhouse://``), checked; no credentials allowed."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https", "clickhouse") or not parts.hostname:
        raise ConfigError(f"{flag}: {url!r} is not http://HOST:PORT")
    if parts.username or parts.password:
        raise ConfigError(
            f"{flag}: put no credentials in the URL; use {USER_ENV} and {PASSWORD_ENV} "
            f"(or {PASSWORD_FILE_ENV})"
        )
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError as e:
        raise ConfigError(f"{flag}: {url!r} has a bad port") from e
    scheme = "http" if parts.scheme == "clickhouse" else parts.scheme
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{scheme}://{host}:{port}"


def parse_query_url(url: str) -> tuple[str, str, str]:
    """``clickhouse://HOST:PORT/DB.TABLE`` -> (http base URL, db, table)."""
    parts = urlsplit(url)
    if parts.scheme != "clickhouse":
        raise ConfigError(f"{url!r} is not clickhouse://HOST:PORT/DB.TABLE")
    db, table = split_table(parts.path.lstrip("/"), "clickhouse:// URL")
    return base_url(url, "clickhouse:// URL"), db, table


def error_text(body: str) -> tuple[str, int | None]:
    """The message and code of a ClickHouse error body (old and new formats)."""
    line = body.strip().splitlines()[0] if body.strip() else "empty answer"
    code = None
    if m := re.match(r"Code: (\d+)[.,]\s*", line):
        code = int(m.group(1))
        line = line[m.end() :]
    line = line.replace("e.displayText() = ", "")
    line = re.sub(r",? e\.what\(\) = .*$", "", line)
    line = re.sub(r" \(version [^)]*\)\s*$", "", line)
    line = line.removeprefix("DB::Exception: ").strip()
    return line, code


class Client:
    """One ClickHouse server's HTTP interface."""

    def __init__(
        self,
        url: str,
        credentials: Credentials | None = None,
        *,
        timeout_s: float = 30.0,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        self.url = base_url(url)
        self._auth = credentials or Credentials.from_env()
        self.timeout_s = timeout_s
        self.settings = dict(settings or {})
        self._session = requests.Session()

    def close(self) -> None:
        self._session.close()

    def _post(self, body: bytes, params: dict[str, Any]) -> requests.Response:
        try:
            r = self._session.post(
                self.url,
                params={**self.settings, **params},
                data=body,
                auth=(self._auth.user, self._auth.password),
                timeout=self.timeout_s,
            )
        except requests.RequestException as e:
            reason = type(e).__name__
            raise ClickHouseError(f"ClickHouse at {self.url} unreachable ({reason})") from e
        if r.status_code >= 400:
            message, code = error_text(r.text)
            if r.status_code in (401, 403) or code in (192, 193, 516):
                message = f"authentication failed for user {self._auth.user!r}"
            raise ClickHouseError(
                f"ClickHouse at {self.url}: {message}", status=r.status_code, code=code
            )
        return r

    def execute(self, sql: str) -> None:
        """Run a statement that returns nothing (DDL)."""
        self._post(sql.encode(), {})

    def rows(self, sql: str) -> list[dict[str, Any]]:
        """Run a SELECT; rows as dicts (64-bit integers as numbers)."""
        r = self._post(
            f"{sql}\nFORMAT JSON".encode(), {"output_format_json_quote_64bit_integers": 0}
        )
        return list(orjson.loads(r.content)["data"])

    def table(self, sql: str) -> tuple[list[str], list[str], list[list[Any]]]:
        """Run a SELECT; (column names, ClickHouse types, rows as lists)."""
        r = self._post(
            f"{sql}\nFORMAT JSONCompact".encode(), {"output_format_json_quote_64bit_integers": 0}
        )
        doc = orjson.loads(r.content)
        meta = doc["meta"]
        return [m["name"] for m in meta], [m["type"] for m in meta], doc["data"]

    def insert(self, table: str, body: bytes, settings: Mapping[str, Any] | None = None) -> None:
        """Insert ``JSONEachRow`` lines into ``table`` (``DB.TABLE``)."""
        self._post(body, {"query": f"INSERT INTO {table} FORMAT JSONEachRow", **(settings or {})})

    def ping(self) -> str:
        """The server's version; raises ClickHouseError when it cannot be reached or logged in."""
        return str(self.rows("SELECT version() AS v")[0]["v"])
