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
from collections.abc import Callable, Iterator, Sequence
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


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def column_format(column: str, values: Sequence[Any]) -> Callable[[Any], str]:
    """One number format for every value of a column (``human`` for the rest): decimals
    from the column's largest magnitude, as ``human`` would write that one (so 0.10 / 2.10 /
    0.24 line up, not 0.1 / 2.10 / 0.235); whole numbers with thousands separators when
    some value reaches 10,000; ratios as percentages, two decimals (none past 1,000%)."""
    floats = [abs(v) for v in values if isinstance(v, float) and not math.isnan(v)]
    ints = [abs(v) for v in values if _number(v) and not isinstance(v, float)]
    top = max(floats + ints, default=0.0)
    if not floats:
        sep = "," if top >= 10000 else ""
        return lambda v: format(v, f"{sep}d") if _number(v) else human(column, v)
    if _is_ratio(column):
        decimals = 0 if top * 100 >= 1000 else 2
        return lambda v: f"{v * 100:,.{decimals}f}%" if _number(v) else human(column, v)
    decimals = 0 if top >= 10000 else 1 if top >= 100 else 2 if top >= 1 or top == 0 else 3
    sep = "," if top >= 10000 else ""

    def fmt(v: Any) -> str:
        if not _number(v) or (isinstance(v, float) and math.isnan(v)):
            return human(column, v)
        return format(float(v), f"{sep}.{decimals}f")

    return fmt


def _transposed(table: Table) -> tuple[list[str], list[list[str]]]:
    """One row per column of ``table``; the first column's values become the headers."""
    key = table.columns[0]
    header = [key, *(human(key, r[0]) for r in table.rows)]
    body = []
    for i, col in enumerate(table.columns):
        if i > 0:
            fmt = column_format(col, [r[i] for r in table.rows])
            body.append([col, *(fmt(r[i]) for r in table.rows)])
    return header, body


def _cells(table: Table, transpose: bool) -> tuple[list[str], list[list[str]]]:
    if transpose:
        return _transposed(table)
    fmts = [column_format(c, table.values(c)) for c in table.columns]
    body = [[f(v) for f, v in zip(fmts, r, strict=True)] for r in table.rows]
    return list(table.columns), body


def _text(header: list[str], body: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *body, strict=True)]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in body)]) + "\n"


def _empty(cell: str) -> bool:
    """A cell that says nothing: a dash, "no", or a zero however it is written."""
    text = cell.strip().rstrip("%").replace(",", "")
    if text in ("-", "no", ""):
        return True
    try:
        return float(text) == 0
    except ValueError:
        return False


def _fitted(header: list[str], body: list[list[str]], width: int) -> str:
    """The table in blocks of columns, each at most ``width`` wide, the first column
    repeated in each; columns with nothing but zeros or dashes left out and named below."""
    widths = [max(len(x) for x in col) for col in zip(header, *body, strict=True)]
    if sum(widths) + 2 * (len(widths) - 1) <= width:
        return _text(header, body)
    empty = [i for i in range(1, len(header)) if body and all(_empty(r[i]) for r in body)]
    note = ""
    if empty and len(empty) < len(header) - 1:
        note = f"(0 or - in every row: {', '.join(header[i] for i in empty)})\n"
        keep = [i for i in range(len(header)) if i not in empty]
        header = [header[i] for i in keep]
        body = [[r[i] for i in keep] for r in body]
    widths = [max(len(x) for x in col) for col in zip(header, *body, strict=True)]
    cap = max(width - widths[0] - 2, 8)
    blocks: list[list[int]] = [[]]
    used = widths[0]
    for i in range(1, len(header)):
        w = min(widths[i], cap) + 2
        if blocks[-1] and used + w > width:
            blocks.append([])
            used = widths[0]
        blocks[-1].append(i)
        used += w
    out = []
    for cols in blocks:
        pick = [0, *cols]
        cells = [[_clip(r[i], cap if i else width) for i in pick] for r in body]
        out.append(_text([_clip(header[i], cap) for i in pick], cells))
    return "\n".join(out) + note


def _clip(cell: str, width: int) -> str:
    return cell if len(cell) <= width else cell[: width - 1] + "…"


def informative(table: Table) -> bool:
    """Whether a table of a multi-table answer says something: some row, more than one
    value, and a number that is not 0 (a table of zeros, or of one value, is left out)."""
    if not table.rows:
        return False
    cells = [v for r in table.rows for v in r[1:]]
    if len(cells) <= 1:
        return False
    numbers = [v for v in cells if _number(v) and not (isinstance(v, float) and math.isnan(v))]
    return not numbers or any(v != 0 for v in numbers)


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


def render(
    table: Table, fmt: str = "table", transpose: bool = False, width: int | None = None
) -> str:
    """``table`` as text in one of ``FORMATS``; ``transpose`` applies to table and markdown.
    A ``table`` fits ``width`` columns (default: the terminal's, ``obs.query.terminal``):
    too wide, its all-zero columns are named instead of shown and the rest split into
    blocks of columns, each with the first column again."""
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
        from obs.query.terminal import width as terminal_width

        return _fitted(header, body, width or terminal_width())
    raise ValueError(f"unknown format {fmt!r}")
