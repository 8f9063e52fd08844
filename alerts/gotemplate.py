"""Render the few Prometheus template forms the generated annotations use, as Prometheus does.

The promtool tests compare annotations exactly, so the expected text is
rendered here from the rule's own annotation and the value the test's input
series are built to produce. Only the forms below are supported; anything
else raises, so a new form in the rules cannot slip past the tests.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal

_ACTION = re.compile(r"\{\{\s*(.*?)\s*\}\}")
_PRINTF = re.compile(r'printf "(%\.\d+[fg])" \$value')
_LABEL = re.compile(r"\$labels\.([A-Za-z_][A-Za-z0-9_]*)")


# ``{{ range query `PROMQL` }}BODY{{ else }}EMPTY{{ end }}``: the first sample's labels and
# value (.Labels.x, .Value) in BODY; the tests give what the query returns.
RANGE = re.compile(
    r"\{\{ range query `(?P<q>[^`]*)` \}\}(?P<body>.*?)\{\{ else \}\}(?P<empty>.*?)\{\{ end \}\}"
)
_SAMPLE = re.compile(
    r"\{\{ (?:\.Labels\.(?P<label>\w+)|printf \"(?P<fmt>%\.\d+[fg])\" \.Value) \}\}"
)

# ``{{ if eq .Labels.x "a" }}A{{ else if eq .Labels.x "b" }}B{{ end }}`` (no bare else,
# no nesting) in a range block's BODY: the arm whose value the sample's label has.
_IF_CHAIN = re.compile(r'\{\{ if eq \.Labels\.\w+ "[^"]*" \}\}.*?\{\{ end \}\}')
_ARM = re.compile(r'\{\{ (?:else )?if eq \.Labels\.(?P<label>\w+) "(?P<value>[^"]*)" \}\}')

Sample = tuple[Mapping[str, str], float]


def _choose(body: str, labels: Mapping[str, str]) -> str:
    def chain(m: re.Match[str]) -> str:
        text = m.group(0).removesuffix("{{ end }}")
        arms = list(_ARM.finditer(text))
        for i, arm in enumerate(arms):
            end = arms[i + 1].start() if i + 1 < len(arms) else len(text)
            if labels.get(arm.group("label")) == arm.group("value"):
                return text[arm.end() : end]
        return ""

    return _IF_CHAIN.sub(chain, body)


def render(
    text: str,
    value: float,
    labels: Mapping[str, str],
    queries: Mapping[str, Sample | None] | None = None,
) -> str:
    """``text`` with every ``{{ ... }}`` action replaced by what Prometheus would print.

    ``queries`` maps each ``range query`` block's PromQL to the one sample it returns
    (None: no sample); a block whose query it lacks raises.
    """

    def block(m: re.Match[str]) -> str:
        q = m.group("q")
        if queries is None or q not in queries:
            raise ValueError(f"the test renderer was not told what {q!r} returns")
        found = queries[q]
        if found is None:
            return m.group("empty")
        sample_labels, sample_value = found

        def sample(s: re.Match[str]) -> str:
            if s.group("label"):
                return sample_labels.get(s.group("label"), "")
            return s.group("fmt") % sample_value

        return _SAMPLE.sub(sample, _choose(m.group("body"), sample_labels))

    text = RANGE.sub(block, text)

    def action(m: re.Match[str]) -> str:
        body = m.group(1)
        if body == "$value":
            return go_float(value)
        if body == "$value | humanizePercentage":
            return f"{value * 100:.4g}%"
        if body == "$value | humanizeDuration":
            return humanize_duration(value)
        if p := _PRINTF.fullmatch(body):
            return p.group(1) % value
        if lbl := _LABEL.fullmatch(body):
            return labels.get(lbl.group(1), "")
        raise ValueError(f"template action {{{{ {body} }}}} is not supported by the test renderer")

    return _ACTION.sub(action, text)


def go_float(v: float) -> str:
    """Go's ``%v`` of a float64: the shortest digits, as ``%e`` below 1e-4 or from 1e6 on."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "0"
    d = Decimal(repr(v)).normalize()
    exp = d.adjusted()
    if -4 <= exp < 6:
        return format(d, "f")
    sign, digits, _ = d.as_tuple()
    text = "".join(map(str, digits))
    mantissa = text[0] + (f".{text[1:]}" if len(text) > 1 else "")
    return f"{'-' if sign else ''}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"


def humanize(v: float) -> str:
    """Prometheus' ``humanize``: 4 significant digits with an SI prefix."""
    if v == 0 or math.isnan(v) or math.isinf(v):
        return f"{v:.4g}"
    if abs(v) >= 1:
        prefix = ""
        for p in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
            if abs(v) < 1000:
                break
            prefix = p
            v /= 1000
        return f"{v:.4g}{prefix}"
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix = p
        v *= 1000
    return f"{v:.4g}{prefix}"


def humanize_duration(v: float) -> str:
    """Prometheus' ``humanizeDuration`` of seconds: ``1m 30s``, ``2.5s``, ``250ms``."""
    if math.isnan(v) or math.isinf(v):
        return f"{v:.4g}"
    if v == 0:
        return f"{v:.4g}s"
    if abs(v) >= 1:
        sign = "-" if v < 0 else ""
        v = abs(v)
        total = int(v)
        s, m, h, d = total % 60, total // 60 % 60, total // 3600 % 24, total // 86400
        if d:
            return f"{sign}{d}d {h}h {m}m {s}s"
        if h:
            return f"{sign}{h}h {m}m {s}s"
        if m:
            return f"{sign}{m}m {s}s"
        return f"{sign}{v:.4g}s"
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix = p
        v *= 1000
    return f"{v:.4g}{prefix}s"
