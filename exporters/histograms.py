"""The per-request histograms: filled once per finished request on the event loop, exposed as
``prometheus_client`` exposes its own.

A request's record observes ten latencies (duration, five phases, TTFT, TPOT, the ITL p95,
the blocked time) and a stream's inter-token gaps. ``prometheus_client.Histogram.observe``
takes two locks, validates the exemplar and searches the buckets one by one: 0.6 us an
observation, 1.5 us with an exemplar, on this project's machine. ``RequestHistogram`` bisects
the bounds and adds to plain lists (0.1-0.2 us): its writer is the event loop alone (the
recorder's thread), and a scrape reads the numbers as they are, as prometheus_client's own
scrape reads its buckets one lock at a time. ``BatchHistogram`` takes a whole request's gaps
at once. ``tests/exporters/test_histograms.py`` checks both expositions against
prometheus_client's for the same observations.
"""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client import metrics as _client
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

from obs import conventions as c

INF = float("inf")
C = TypeVar("C")


class Labelled(Collector, Generic[C]):
    """A collector of labelled children made at their first ``labels`` call (``_new_child``),
    as ``prometheus_client``'s ``labels()`` makes them: ``RequestHistogram`` here,
    ``obs.exporters.counters.RequestCounter``."""

    _metric: c.Metric
    _children: dict[tuple[str, ...], C]

    def labels(self, *values: str) -> C:
        """The child of these label values (made at the first call)."""
        if len(values) != len(self._metric.labels):
            raise ValueError(f"{self._metric.name}: expected {len(self._metric.labels)} labels")
        values = tuple(str(v) for v in values)  # as prometheus_client's labels() takes them
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._new_child()
        return child

    def _new_child(self) -> C:
        raise NotImplementedError


class RequestHistogram(Labelled["HistogramChild"]):
    """A labelled histogram whose children (``labels``) take ``observe(amount, exemplar)``:
    the samples, exemplars and ``_created`` of a ``prometheus_client.Histogram`` with the
    same name, labels and buckets. Observed from one thread."""

    def __init__(
        self, metric: c.Metric, registry: CollectorRegistry, buckets: Iterable[float]
    ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError(f"{metric.name}: buckets not in sorted order")
        if not bounds or bounds[-1] != INF:
            bounds.append(INF)
        self._metric = metric
        self._bounds = bounds
        self._les = [floatToGoString(b) for b in bounds]
        self._children: dict[tuple[str, ...], HistogramChild] = {}
        registry.register(self)

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self._bounds)

    def collect(self) -> Iterable[Metric]:
        m = self._metric
        family = Metric(m.name, m.help, "histogram")
        created = _client._use_created  # PROMETHEUS_DISABLE_CREATED_SERIES, as its own reads it
        for values, child in list(self._children.items()):
            series = dict(zip(m.labels, values, strict=True))
            counts, exemplars = list(child.counts), list(child.exemplars)
            acc = 0.0
            for le, n, exemplar in zip(self._les, counts, exemplars, strict=True):
                acc += n
                ex = None if exemplar is None else Exemplar(*exemplar)
                family.add_sample(f"{m.name}_bucket", {**series, "le": le}, acc, None, ex)
            family.add_sample(f"{m.name}_count", dict(series), acc)
            if self._bounds[0] >= 0:
                family.add_sample(f"{m.name}_sum", dict(series), child.sum)
            if created:
                family.add_sample(f"{m.name}_created", dict(series), child.created)
        return [family]

    def describe(self) -> Iterable[Metric]:
        m = self._metric
        return [Metric(m.name, m.help, "histogram")]


class HistogramChild:
    """One series of a ``RequestHistogram``."""

    __slots__ = ("_bounds", "counts", "created", "exemplars", "sum")

    def __init__(self, bounds: list[float]) -> None:
        self._bounds = bounds
        self.counts = [0] * len(bounds)
        # Per bucket: its exemplar's labels, value and time (an ``Exemplar`` when collected).
        self.exemplars: list[tuple[dict[str, str], float, float] | None] = [None] * len(bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        """Count ``amount`` in the first bucket it is at most; ``exemplar``: the labels of
        that bucket's exemplar (prometheus_client's rule: a NaN is in the sum alone)."""
        self.sum += amount
        if math.isnan(amount):
            return
        i = bisect_left(self._bounds, amount)
        self.counts[i] += 1
        if exemplar:
            self.exemplars[i] = (exemplar, amount, time.time())


class BatchHistogram(Collector):
    """A labelled histogram that takes one request's observations at once.

    A stream of 80 tokens has 79 inter-token gaps: ``Histogram.observe`` would
    take its lock 79 times and convert each gap to seconds. Here the gaps (in
    the caller's unit, ``scale`` per second) are counted into their buckets
    under one lock. Exposed like any histogram (``_bucket``, ``_sum``,
    ``_count``; no ``_created``).
    """

    def __init__(
        self, metric: c.Metric, registry: CollectorRegistry, buckets: Iterable[float], scale: float
    ) -> None:
        self._metric = metric
        self._bounds = sorted(b for b in buckets if b != INF)
        self._scaled = [b * scale for b in self._bounds]
        self._scale = scale
        self._lock = threading.Lock()
        # label values -> [count per bucket (last: above every bound)..., sum in caller's unit]
        self._series: dict[tuple[str, ...], list[float]] = {}
        registry.register(self)

    def observe_many(self, labels: tuple[str, ...], values: Sequence[float]) -> None:
        """Observe every value (in the caller's unit) for the series ``labels``."""
        bounds = self._scaled
        total = sum(values)
        with self._lock:
            row = self._series.get(labels)
            if row is None:
                row = self._series[labels] = [0.0] * (len(bounds) + 2)
            for v in values:  # (a short request has one gap: no per-bucket pass)
                row[bisect_left(bounds, v)] += 1
            row[-1] += total

    def collect(self) -> Iterable[Metric]:
        m = self._metric
        family = HistogramMetricFamily(m.name, m.help, labels=m.labels)
        with self._lock:
            rows = [(k, list(v)) for k, v in self._series.items()]
        for labels, row in rows:
            cumulative, buckets = 0.0, []
            for bound, n in zip([*self._bounds, INF], row[:-1], strict=True):
                cumulative += n
                buckets.append((floatToGoString(bound), cumulative))
            family.add_metric(list(labels), buckets, row[-1] / self._scale)
        return [family]

    def describe(self) -> Iterable[Metric]:
        m = self._metric
        return [HistogramMetricFamily(m.name, m.help, labels=m.labels)]
