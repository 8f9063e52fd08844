"""A small result table and its renderings: table, json, csv, markdown.

Query functions return :class:`Table` (plain columns and row tuples) so the
CLI never imports pandas; the Python API turns them into DataFrames with
:meth:`Table.to_pandas`.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    import pandas as pd

FORMATS = ("table", "json", "csv", "markdown")

# C0 and C1 control characters and DEL: a client's string (its model, request id, tenant)
# must not move the operator's cursor or recolour the terminal (ESC sequences).
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# A spreadsheet runs a CSV cell that starts with one of these as a formula.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")

# Columns shown as percentages in table and markdown output.
_RATIO_SUFFIXES = ("_rate", "_ratio", "_attainment", "availability", "_share", "_objective")


@dataclass(slots=True)
class Table:
    """Column names and rows (tuples), in order."""

    columns: list[str]
    rows: list[tuple[Any, ...]]

    def __len__(self) -> int:
        return len(self.rows)

    def index(self, name: str) -> int:
        return self.columns.index(name)

    def column(self, *names: str) -> Iterator[tuple[Any, ...]]:
        """The values of ``names``, row by row."""
        idx = [self.index(n) for n in names]
        for row in self.rows:
            yield tuple(row[i] for i in idx)

    def values(self, name: str) -> list[Any]:
        i = self.index(name)
        return [row[i] for row in self.rows]

    def drop(self, *names: str) -> Table:
        keep = [i for i, c in enumerate(self.columns) if c not in names]
        return Table(
            [self.columns[i] for i in keep], [tuple(r[i] for i in keep) for r in self.rows]
        )

    def select(self, names: Sequence[str]) -> Table:
        idx = [self.index(n) for n in names]
        return Table(list(names), [tuple(r[i] for i in idx) for r in self.rows])

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]

    def to_pandas(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame.from_records(self.rows, columns=self.columns)


def printable(text: str, keep: str = "") -> str:
    """``text`` with every control character but those in ``keep`` written as an escape
    (``\\x1b``), so a client's string prints as what it is, never as terminal control."""
    return _CONTROLS.sub(lambda m: m[0] if m[0] in keep else f"\\x{ord(m[0]):02x}", text)


def csv_cell(value: Any) -> Any:
    """A CSV cell: a string a spreadsheet would run as a formula gets a leading ``'``."""
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        return "'" + value
    return value


def _is_ratio(column: str) -> bool:
    return column.endswith(_RATIO_SUFFIXES)


def human(column: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if _is_ratio(column):
            return f"{value * 100:.2f}%"
        if abs(value) >= 100:
            return f"{value:,.0f}" if abs(value) >= 10000 else f"{value:.1f}"
        return f"{value:.2f}" if abs(value) >= 1 or value == 0 else f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10000 else str(value)
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="milliseconds")
    return printable(str(value))


def _transposed(table: Table) -> tuple[list[str], list[list[str]]]:
    """One row per column of ``table``; the first column's values become the headers."""
    key = table.columns[0]
    header = [key, *(human(key, r[0]) for r in table.rows)]
    body = [
        [col, *(human(col, r[i]) for r in table.rows)]
        for i, col in enumerate(table.columns)
        if i > 0
    ]
    return header, body


def _cells(table: Table, transpose: bool) -> tuple[list[str], list[list[str]]]:
    if transpose:
        return _transposed(table)
    body = [[human(c, v) for c, v in zip(table.columns, r, strict=True)] for r in table.rows]
    return list(table.columns), body


def _text(header: list[str], body: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=True)]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in body)]) + "\n"


def _markdown(header: list[str], body: list[list[str]]) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    align = "| --- |" + " ---: |" * (len(header) - 1)
    return "\n".join([line(header), align, *(line(r) for r in body)]) + "\n"


def _plain(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 6)
    if isinstance(value, datetime | date):
        return value.isoformat()
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def to_json(data: Any) -> str:
    """Indented JSON; datetimes as ISO strings, NaN as null."""
    return (
        orjson.dumps(
            data, default=_json_default, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY
        ).decode()
        + "\n"
    )


def render(table: Table, fmt: str = "table", transpose: bool = False) -> str:
    """``table`` as text in one of ``FORMATS``; ``transpose`` applies to table and markdown."""
    if fmt == "json":
        return to_json([{k: _plain(v) for k, v in rec.items()} for rec in table.records()])
    if fmt == "csv":
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        w.writerow(table.columns)
        for row in table.rows:
            w.writerow(["" if v is None else csv_cell(_plain(v)) for v in row])
        return out.getvalue()
    if not table.rows:
        return "(no matching events)\n"
    header, body = _cells(table, transpose)
    if fmt == "markdown":
        return _markdown(header, body)
    if fmt == "table":
        return _text(header, body)
    raise ValueError(f"unknown format {fmt!r}")
