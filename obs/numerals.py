"""Whole numbers written as text, read strictly: ASCII digits only.

``str.isdigit()`` is true for characters ``int()`` refuses (``'²'``) or reads as another
script's digit (``'٤'`` is 4), so ``s.isdigit()`` before ``int(s)`` either raises or accepts
a number nobody meant. Engines' flags, pools' error codes, served settings and listener
ports are read here.
"""

from __future__ import annotations


def whole_number(text: str) -> int | None:
    """``text`` as an int when it is one or more ASCII digits, else None (signs, spaces,
    underscores and other scripts' digits included)."""
    return int(text) if text.isascii() and text.isdigit() else None
