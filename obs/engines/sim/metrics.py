"""The simulated replica's ``/metrics``: vLLM V1's names, labels and buckets (vLLM 0.32).

Gauges and counters are read from the scheduler at scrape time (a custom collector,
nothing refilled in a handler); the latency histograms are observed as requests
finish. Every series carries ``engine="0"`` and ``model_name`` as vLLM's do.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
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


ITERATION_BUCKETS: tuple[float, ...] = (
    1,
    8,
    16,
    32,
    64,
    128,
    256,
    512,
    1024,
    2048,
    4096,
    8192,
    16384,
)
PARAMS_N_BUCKETS: tuple[float, ...] = (1, 2, 5, 10, 20)
PREEMPTION_BUCKETS: tuple[float, ...] = (1, 2, 3, 4, 5, 10, 20)
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


def token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 buckets up to the context length (its token-count histograms)."""
    out: list[float] = []
    magnitude = 1
    while True:
        for m in (1, 2, 5):
            if m * magnitude > max_model_len:
                return tuple(out)
            out.append(float(m * magnitude))
        magnitude *= 10


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

    def __init__(
        self, scheduler: Scheduler, model: str, config: dict[str, str], max_model_len: int = 32768
    ) -> None:
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

        self.inference = hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_BUCKETS,
        )
        self.tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        tokens = token_buckets(max_model_len)
        self.prompt_tokens = hist(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens
        )
        self.generation_tokens = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.max_generation_tokens = hist(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tokens,
        )
        self.params_max_tokens = hist(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            tokens,
        )
        self.params_n = hist(
            "vllm:request_params_n", "Histogram of the n request parameter.", PARAMS_N_BUCKETS
        )
        self.preemptions = hist(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            PREEMPTION_BUCKETS,
        )
        self.iteration_tokens = hist(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_BUCKETS,
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ["engine", "finished_reason", "model_name"],
            registry=self.registry,
        )
        self.success = {r: success.labels("0", r, model) for r in FINISHED_REASONS}

    def finished(self, req: SimRequest) -> None:
        """Observe a finished request's latencies (engine-side, as vLLM measures them), its
        token counts and parameters, and count it under its finish reason."""
        if req.finished_s is None or req.first_token_s is None or req.scheduled_s is None:
            return
        self.success[req.finish_reason].inc()
        self.e2e.observe(req.finished_s - req.arrival_s)
        self.queue.observe(req.scheduled_s - req.arrival_s)
        self.prefill.observe(req.first_token_s - req.scheduled_s)
        self.decode.observe(req.finished_s - req.first_token_s)
        self.inference.observe(req.finished_s - req.scheduled_s)
        if req.output > 1:
            self.tpot.observe((req.finished_s - req.first_token_s) / (req.output - 1))
        self._counts(req)

    def aborted(self, req: SimRequest) -> None:
        """A request its client left before it finished: counted under ``abort``, with the
        tokens it had (vLLM records an aborted request's stats too)."""
        self.success["abort"].inc()
        self._counts(req)

    def _counts(self, req: SimRequest) -> None:
        self.prompt_tokens.observe(req.prompt_tokens)
        self.generation_tokens.observe(req.output)
        self.max_generation_tokens.observe(req.max_tokens)
        self.params_max_tokens.observe(req.max_tokens)
        self.params_n.observe(req.n)
        self.preemptions.observe(req.preemptions)

    def first_token(self, req: SimRequest) -> None:
        if req.first_token_s is not None:
            self.ttft.observe(req.first_token_s - req.arrival_s)
