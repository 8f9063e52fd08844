"""The simulated replica's ``/metrics``: vLLM V1's names, labels and buckets (vLLM 0.32).

Gauges and counters are read from the scheduler at scrape time (a custom collector,
nothing refilled in a handler); the latency histograms are observed as requests
finish. Every series carries ``engine="0"`` and ``model_name`` as vLLM's do.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from obs import conventions as c
from obs.engines.sim.scheduler import Scheduler, SimRequest

LABELS = ("engine", "model_name")
TTFT_BUCKETS: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS: tuple[float, ...] = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_BUCKETS: tuple[float, ...] = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class _State(Collector):
    def __init__(self, scheduler: Scheduler, labels: list[str], config: dict[str, str]) -> None:
        self.s = scheduler
        self.labels = labels
        self.config = config

    def collect(self) -> Iterator[Metric]:
        s, kv, lv = self.s, self.s.kv, self.labels
        for name, doc, value in (
            (c.VLLM_RUNNING, "Number of requests in model execution batches.", len(s.running)),
            (c.VLLM_WAITING, "Number of requests waiting to be processed.", len(s.waiting)),
            (c.VLLM_KV_CACHE_USAGE, "KV-cache usage. 1 means 100 percent usage.", kv.usage),
        ):
            g = GaugeMetricFamily(name, doc, labels=LABELS)
            g.add_metric(lv, float(value))
            yield g
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=[*self.config, "engine"],
        )
        info.add_metric([*self.config.values(), "0"], 1.0)
        yield info
        for name, doc, value in (
            (
                c.VLLM_PREFIX_QUERIES,
                "Prefix cache queries, in terms of number of queried tokens.",
                kv.query_tokens,
            ),
            (
                c.VLLM_PREFIX_HITS,
                "Prefix cache hits, in terms of number of cached tokens.",
                kv.hit_tokens,
            ),
            (
                c.VLLM_PREEMPTIONS,
                "Cumulative number of preemption from the engine.",
                s.preemptions,
            ),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", s.prompt_tokens),
            (
                "vllm:generation_tokens",
                "Number of generation tokens processed.",
                s.generation_tokens,
            ),
        ):
            counter = CounterMetricFamily(name.removesuffix("_total"), doc, labels=LABELS)
            counter.add_metric(lv, float(value))
            yield counter


class SimMetrics:
    """The registry of one simulated replica."""

    def __init__(self, scheduler: Scheduler, model: str, config: dict[str, str]) -> None:
        self.registry = CollectorRegistry()
        self.labels = ["0", model]
        self.registry.register(_State(scheduler, self.labels, config))

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, LABELS, buckets=buckets, registry=self.registry).labels(
                *self.labels
            )

        self.ttft = hist(c.VLLM_TTFT, "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = hist(c.VLLM_ITL, "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_BUCKETS,
        )
        self.queue = hist(
            c.VLLM_QUEUE_TIME,
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_BUCKETS,
        )
        self.prefill = hist(
            c.VLLM_PREFILL_TIME,
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_BUCKETS,
        )
        self.decode = hist(
            c.VLLM_DECODE_TIME,
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_BUCKETS,
        )

    def finished(self, req: SimRequest) -> None:
        """Observe a finished request's latencies (engine-side, as vLLM measures them)."""
        if req.finished_s is None or req.first_token_s is None or req.scheduled_s is None:
            return
        self.e2e.observe(req.finished_s - req.arrival_s)
        self.queue.observe(req.scheduled_s - req.arrival_s)
        self.prefill.observe(req.first_token_s - req.scheduled_s)
        self.decode.observe(req.finished_s - req.first_token_s)

    def first_token(self, req: SimRequest) -> None:
        if req.first_token_s is not None:
            self.ttft.observe(req.first_token_s - req.arrival_s)
