"""PromQL building blocks shared by the rule and dashboard generators.

Pure string builders: matchers, selectors, rates, aggregations. Metric names
come from ``obs.conventions``; what each generator builds from these lives in
``obs.alerts.expr`` (SLI error ratios) and ``obs.dashboards.expr`` (template
variables, quantiles, joins). The only difference between the two outputs is
the separator between matchers: rules are written compact (``{a="1",b="2"}``),
dashboards spaced (``{a="1", b="2"}``), so ``selector`` takes it.
"""

from __future__ import annotations

SPACED = ", "
COMPACT = ","


def eq(label: str, value: str) -> str:
    """An equality matcher: ``label="value"``."""
    return f'{label}="{value}"'


def like(label: str, value: str) -> str:
    """A regex matcher: ``label=~"value"``."""
    return f'{label}=~"{value}"'


def unlike(label: str, value: str) -> str:
    """A negative regex matcher: ``label!~"value"``."""
    return f'{label}!~"{value}"'


def one_of(label: str, values: tuple[str, ...], negate: bool = False) -> str:
    """Match any of ``values`` (``=``/``!=`` for one value, a regex for several)."""
    if len(values) == 1:
        return f'{label}{"!=" if negate else "="}"{values[0]}"'
    return f'{label}{"!~" if negate else "=~"}"{"|".join(values)}"'


def selector(name: str, *matchers: str, sep: str = SPACED) -> str:
    """``name{m1, m2}``, or the bare name when there are no matchers."""
    return f"{name}{{{sep.join(matchers)}}}" if matchers else name


def rate(sel: str, window: str) -> str:
    """Per-second rate of a counter selector over ``window``."""
    return f"rate({sel}[{window}])"


def increase(sel: str, window: str) -> str:
    """Increase of a counter selector over ``window``."""
    return f"increase({sel}[{window}])"


def agg(op: str, expr: str, *by: str) -> str:
    """``op by (labels) (expr)``, or ``op(expr)`` when no labels are kept."""
    return f"{op} by ({', '.join(by)}) ({expr})" if by else f"{op}({expr})"


def positive(expr: str) -> str:
    """``expr`` where it is above zero: a denominator that yields no sample, not NaN."""
    return f"({expr} > 0)"


def num(x: float) -> str:
    """A number as PromQL and people read it: 14.4, 6, 0.005."""
    return format(x, "g")
