"""Exemplars: the latency histograms carry the request's trace id in the OpenMetrics exposition,
and the ``--workers`` merge keeps them (fresh registries, pages as prometheus_client writes)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from obs import conventions as c
from obs.attribution import MissStamp
from obs.config import Config, parse_config
from obs.dashboards.build import iter_panels
from obs.dashboards.build import render as render_dashboards
from obs.demo.prometheus import PrometheusProcess, write_config
from obs.events import Event
from obs.exporters.prom import Metrics
from obs.phases import Clock
from obs.record import Finished
from obs.sidecar.server.worker_metrics import merge_pages
from obs.tracecontext import TraceIds

CONFIG: Config = parse_config(
    {
        "pools": [{"name": "small", "replicas": ["http://127.0.0.1:9"]}],
        "lanes": [{"name": "chat", "pool": "small"}],
        "default_lane": "chat",
    }
)


# A lane judged on TTFT: a request over 500 ms misses it.
JUDGED: Config = parse_config(
    {
        "pools": [{"name": "small", "replicas": ["http://127.0.0.1:9"]}],
        "lanes": [
            {"name": "chat", "pool": "small", "slo": {"ttft": {"threshold_ms": 500}}},
        ],
        "default_lane": "chat",
    }
)


def _finished(
    trace_id: int, *, sampled: bool = True, ttft_ms: float = 21.5, lane: str = "chat"
) -> Finished:
    ev = Event(
        request_id=f"r{trace_id}",
        model="tiny",
        lane=lane,
        pool="small",
        stream=True,
        completion_tokens=8,
        ttft_ms=ttft_ms,
        tpot_ms=4.0,
        e2e_ms=60.0,
    )
    clock = Clock(received=1_000, dispatched=2_000, first_up=5_000, first_sent=6_000)
    clock.last_up, clock.end = 9_000, 10_000
    return Finished(ev, clock, 1_700_000_000_000_000_000, TraceIds(trace_id, 7, None, sampled))


def _exemplars(page: str) -> dict[str, set[str]]:
    """Family name -> every trace id its samples carry as exemplars."""
    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(page):
        for s in fam.samples:
            if s.exemplar is not None:
                out.setdefault(fam.name, set()).add(s.exemplar.labels[c.EXEMPLAR_TRACE_ID])
    return out


def _page(*finished: Finished, config: Config = CONFIG) -> str:
    """The OpenMetrics page after the sidecar's fan-out (attribution, then the metrics)."""
    reg = CollectorRegistry()
    stamp, metrics = MissStamp(config), Metrics(config, reg)
    for f in finished:
        stamp.on_end(f)
        metrics.export(f)
    return openmetrics.generate_latest(reg).decode()


def test_latency_histograms_carry_the_trace_id_in_openmetrics() -> None:
    """TTFT, TPOT and end-to-end buckets have a ``# {trace_id="..."}`` exemplar; ITL does not."""
    f = _finished(0xAB)
    page = _page(f)
    want = {m.name: {f.ids.trace_id_hex} for m in c.EXEMPLAR_METRICS}
    assert _exemplars(page) == want
    assert f'# {{trace_id="{f.ids.trace_id_hex}"}} 0.0215' in page


def test_misses_counter_carries_the_trace_id_of_a_missed_request() -> None:
    """The SLO misses counter's exemplar is the trace id of the request that missed (the
    latest miss of its series); a good request leaves the counter without one."""
    good, slow = _finished(0x10), _finished(0x11, ttft_ms=900.0)
    slower = _finished(0x12, ttft_ms=2_000.0)
    page = _page(good, config=JUDGED)
    assert c.SLO_MISSES.name not in _exemplars(page)
    page = _page(good, slow, config=JUDGED)
    assert _exemplars(page)[c.SLO_MISSES.name] == {slow.ids.trace_id_hex}
    assert f'# {{trace_id="{slow.ids.trace_id_hex}"}} 1.0' in page
    page = _page(good, slow, slower, config=JUDGED)
    (fam,) = [f for f in text_string_to_metric_families(page) if f.name == c.SLO_MISSES.name]
    (total,) = [s for s in fam.samples if s.name.endswith("_total")]
    assert total.value == 2  # both misses charged alike: one series, the later exemplar
    assert total.exemplar is not None
    assert total.exemplar.labels == {c.EXEMPLAR_TRACE_ID: slower.ids.trace_id_hex}
    unsampled = _finished(0x13, sampled=False, ttft_ms=900.0)
    assert c.SLO_MISSES.name not in _exemplars(_page(good, unsampled, config=JUDGED))


def test_unsampled_requests_and_the_text_format_have_no_exemplars() -> None:
    """A trace that is not sampled (not exported) gives no exemplar; the 0.0.4 text has none."""
    assert _exemplars(_page(_finished(0xCD, sampled=False))) == {}
    reg = CollectorRegistry()
    Metrics(CONFIG, reg).export(_finished(0xEF))
    assert b"trace_id" not in generate_latest(reg)


def test_workers_merge_keeps_the_latest_exemplar_of_each_bucket() -> None:
    """Two workers' OpenMetrics pages: counts add up and each bucket keeps an exemplar of one
    of the requests in it, the most recent; the merged page re-encodes as OpenMetrics."""
    a, b = _finished(0x01), _finished(0x02, ttft_ms=2_500.0)
    first, second = _page(a), _page(b)
    merged_reg = CollectorRegistry(auto_describe=False)
    merged_reg.register(_Pages([first, second]))
    page = openmetrics.generate_latest(merged_reg).decode()
    ttft = {
        s.labels["le"]: s
        for fam in text_string_to_metric_families(page)
        if fam.name == c.TTFT.name
        for s in fam.samples
        if s.name.endswith("_bucket")
    }
    assert ttft["+Inf"].value == 2
    assert ttft["0.025"].exemplar is not None
    assert ttft["0.025"].exemplar.labels == {c.EXEMPLAR_TRACE_ID: a.ids.trace_id_hex}
    assert ttft["3.0"].exemplar is not None
    assert ttft["3.0"].exemplar.labels == {c.EXEMPLAR_TRACE_ID: b.ids.trace_id_hex}
    # both took 60 ms: one bucket, one exemplar (of one of them)
    assert len(_exemplars(page)[c.REQUEST_DURATION.name]) == 1


class _Pages(Collector):
    """Workers' pages merged at each collection, as the merged registry does."""

    def __init__(self, pages: list[str]) -> None:
        self.pages = pages

    def collect(self) -> Iterable[Metric]:
        return merge_pages(self.pages)


def test_generated_prometheus_config_and_command_store_exemplars(tmp_path: Path) -> None:
    """The Prometheus config the demo and live stack write sizes the exemplar ring, and the
    process they start turns exemplar storage on."""
    path = write_config(
        tmp_path / "prometheus.yml",
        sidecar_url="http://127.0.0.1:8000",
        pools={"small": ["http://127.0.0.1:8001"]},
        rules_dir=tmp_path,
        interval_s=1,
    )
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert config["storage"]["exemplars"]["max_exemplars"] > 0
    process = PrometheusProcess("prometheus", path, tmp_path / "data", tmp_path / "log", 9)
    assert "--enable-feature=exemplar-storage" in process.command()


def test_latency_panels_ask_for_exemplars_once_per_panel() -> None:
    """The overview's and lane drill-down's TTFT, TPOT and end-to-end quantile panels fetch
    exemplars on their first target only; no other panel does."""
    boards = render_dashboards(CONFIG)
    asking = {
        (uid, p["title"]): [t.get("exemplar", False) for t in p["targets"]]
        for uid, board in boards.items()
        for p in iter_panels(board)
        if any(t.get("exemplar") for t in p.get("targets", []))
    }
    assert set(asking) == {
        ("vllm-obs-overview", "TTFT p50 / p95 / p99 by lane"),
        ("vllm-obs-overview", "TPOT p50 / p95 / p99 by lane"),
        ("vllm-obs-overview", "End-to-end p50 / p95 / p99 by lane"),
        ("vllm-obs-lane", "TTFT p50 / p95 / p99"),
        ("vllm-obs-lane", "TPOT p50 / p95 / p99"),
    }
    assert all(flags[0] and not any(flags[1:]) for flags in asking.values())


def test_error_budget_row_shows_the_misses_exemplars() -> None:
    """A lane with an SLO: its error-budget row has one panel that fetches the misses
    counter's exemplars (on its first target), beside the latency panels."""
    boards = render_dashboards(JUDGED)
    asking = [
        (uid, p["title"], p["targets"][0]["expr"])
        for uid, board in boards.items()
        for p in iter_panels(board)
        if p.get("targets") and p["targets"][0].get("exemplar")
    ]
    budget = [(uid, title, expr) for uid, title, expr in asking if c.SLO_MISSES.name in expr]
    assert [(uid, title) for uid, title, _ in budget] == [
        ("vllm-obs-slo", "chat: misses by phase and cause, with their traces")
    ]
    assert 'lane="chat"' in budget[0][2]
