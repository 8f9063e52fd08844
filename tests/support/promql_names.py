"""Which metric names a PromQL expression reads: a small, pure, regex-based extractor.

Good enough for the expressions this project generates (and most hand-written
ones): it removes string literals, label matchers, ranges, grouping clauses,
numbers and durations, then keeps every identifier that is neither a keyword
nor a function call. Names given as ``{__name__="..."}`` are found too.
It does not validate the expression; ``promtool check rules`` does that.
"""

from __future__ import annotations

import re

KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "bool",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "offset",
        "inf",
        "nan",
    }
)

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_NAME_MATCHER = re.compile(r'__name__\s*=\s*("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')')
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_NUMBER = re.compile(
    r"(?<![\w:.])(?:0x[0-9a-fA-F]+"
    r"|(?:\d+(?:ms|[smhdwy]))+"
    r"|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
)
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_CALL = re.compile(r"\s*\(")


def metric_names(expr: str) -> set[str]:
    """Every metric (or recording rule) name that ``expr`` selects."""
    names = {m.group(1)[1:-1] for m in _NAME_MATCHER.finditer(expr)}
    text = _STRING.sub('""', _strip_comments(expr))
    text = _BRACES.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    for m in _IDENT.finditer(text):
        word = m.group(0)
        if word.lower() in KEYWORDS or _CALL.match(text, m.end()):
            continue
        names.add(word)
    return names


def _strip_comments(expr: str) -> str:
    """Drop ``# ...`` comments (outside string literals)."""
    out = []
    for line in expr.splitlines():
        pos = 0
        cut = len(line)
        while pos < len(line):
            s = _STRING.search(line, pos)
            hash_at = line.find("#", pos)
            if hash_at == -1:
                break
            if s is None or hash_at < s.start():
                cut = hash_at
                break
            pos = s.end()
        out.append(line[:cut])
    return "\n".join(out)
