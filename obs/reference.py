"""README reference tables generated from the code (event fields, metric names, engines).

``python -m obs.reference README.md`` rewrites the tables between their
markers; a test fails when the README and the code disagree.
"""

from __future__ import annotations

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
    path = Path(argv[0] if argv else "README.md")
    path.write_text(render(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
