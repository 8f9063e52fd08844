"""The terminal a query's answer goes to: its width, and prose wrapped to it.

Every ``vllm-obs query`` answer in table form fits the width here (``obs.query.table.render``
splits a wide table into blocks of columns); prose (headings, verdicts, the incident's
sentences) goes through :func:`wrap`. A TTY's own width when it has one; 120 columns when the
output is not a terminal (a pipe, a file, a pager) or its width is unknown.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from typing import TextIO

DEFAULT_WIDTH = 120
MIN_WIDTH = 40  # below this, nothing useful fits: wrap as if the terminal had it


def width(stream: TextIO | None = None) -> int:
    """Columns of ``stream`` (stdout) when it is a terminal, else ``DEFAULT_WIDTH``."""
    out = stream or sys.stdout
    try:
        tty = out.isatty()
    except (AttributeError, ValueError):
        tty = False
    if not tty:
        return DEFAULT_WIDTH
    try:
        columns = os.get_terminal_size(out.fileno()).columns
    except (AttributeError, ValueError, OSError):
        columns = shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
    return max(columns or DEFAULT_WIDTH, MIN_WIDTH)


def wrap(text: str, columns: int | None = None) -> str:
    """``text`` with each line longer than ``columns`` wrapped, continuation lines indented
    like the line's own first word (a bullet's text under its text)."""
    cols = columns or width()
    out = []
    for line in text.split("\n"):
        if len(line) <= cols:
            out.append(line)
            continue
        body = line.lstrip(" ")
        indent = " " * (len(line) - len(body))
        hang = indent + " " * (len(body) - len(body.lstrip("-*• ")))
        out.append(
            textwrap.fill(
                body,
                cols,
                initial_indent=indent,
                subsequent_indent=hang,
                break_long_words=False,
                break_on_hyphens=False,
            )
        )
    return "\n".join(out)
