"""A registry's two exposition pages with what only the clock sets masked: each series'
``_created`` and each exemplar's timestamp (the exporters' own collectors against
``prometheus_client``'s, tests/exporters/test_counters.py and test_histograms.py)."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

_CREATED = re.compile(rb"(_created(?:\{[^}]*\})?) \S+")
_EXEMPLAR_TIME = re.compile(rb"(# \{[^}]*\} \S+) \S+")


def pages(registry: CollectorRegistry) -> tuple[bytes, bytes]:
    """The text and OpenMetrics pages of ``registry``, clock-set values replaced by ``T``."""
    text, om = generate_latest(registry), generate_openmetrics(registry)
    return _CREATED.sub(rb"\1 T", text), _EXEMPLAR_TIME.sub(rb"\1 T", _CREATED.sub(rb"\1 T", om))
