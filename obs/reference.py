"""The reference tables of docs/reference.md, generated from the code (event fields, metric
names, engines).

``python -m obs.reference docs/reference.md`` rewrites the tables between their
markers; a test fails when the page and the code disagree.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from obs import conventions as c
from obs.engines.adapters import matrix
from obs.events import field_docs


def event_table() -> str:
    rows = ["| field | type | meaning |", "|---|---|---|"]
    for name, typ, doc in field_docs():
        rows.append(f"| `{name}` | {typ.replace('|', 'or')} | {doc.replace('|', '/')} |")
    return "\n".join(rows)


def metric_table() -> str:
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for m in c.ALL_METRICS:
        name = f"{m.name}_total" if m.kind == "counter" else m.name
        rows.append(f"| `{name}` | {m.kind} | {', '.join(m.labels)} | {m.help} |")
    return "\n".join(rows)


TABLES = {
    "event-fields": event_table,
    "metrics": metric_table,
    "engines": matrix.engine_table,
    "engine-events": matrix.event_table,
}


def _replacer(table: str) -> Callable[[re.Match[str]], str]:
    return lambda m: m.group(1) + table + "\n" + m.group(2)


def render(text: str) -> str:
    """``text`` with every generated table replaced by what the code says now."""
    for name, fn in TABLES.items():
        pattern = re.compile(
            rf"(<!-- BEGIN GENERATED {name} -->\n).*?(<!-- END GENERATED {name} -->)", re.S
        )
        text = pattern.sub(_replacer(fn()), text)
    return text


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m obs.reference",
        description="Rewrite the reference tables (event fields, metrics, engines) between their "
        "markers in a Markdown file, from the code.",
    )
    ap.add_argument(
        "path",
        nargs="?",
        default="docs/reference.md",
        help="the file (default: docs/reference.md)",
    )
    path = Path(ap.parse_args(argv).path)
    try:
        text = path.read_text()
    except OSError as err:
        print(f"obs.reference: cannot read {path}: {err.strerror}", file=sys.stderr)
        return 2
    path.write_text(render(text))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
