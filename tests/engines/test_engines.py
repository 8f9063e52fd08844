"""Engine adapters: each engine's /metrics page to the engine-neutral pool state.

vLLM's and llama.cpp's pages are captures from real servers; SGLang's and TGI's are
written from their metric definitions (see tests/data/README.md): neither engine
runs on these CPU-only machines, so these captures are the only way to pin them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from obs.config import parse_config
from obs.engines.adapters import ADAPTERS, reports, unknown_state
from obs.engines.metrics import STATE_FIELDS, EngineState, Sums, plus
from obs.errors import ConfigError
from obs.exporters.prom import PoolStateCollector
from obs.sidecar.pools.engine_scrape import ExpositionError, detect_page, parse_sums, read_state

DATA = Path(__file__).parents[1] / "data"
VLLM_PAGE = (DATA / "vllm-0.32-cpu-metrics.txt").read_text()
SGLANG_PAGE = (DATA / "sglang-metrics.txt").read_text()
TGI_PAGE = (DATA / "tgi-metrics.txt").read_text()
LLAMACPP_PAGE = (DATA / "llamacpp-metrics.txt").read_text()


def test_vllm_page_maps_every_field_from_its_own_samples() -> None:
    """vLLM reports all six values; the prefix counters are its own totals."""
    state = read_state("vllm", VLLM_PAGE)
    assert state.reported() == frozenset(STATE_FIELDS)
    sums = parse_sums(VLLM_PAGE)
    assert state.prefix_queries == sums.sum("vllm:prefix_cache_queries_total")
    assert state.prefix_hits == sums.sum("vllm:prefix_cache_hits_total")
    assert state.prefix_queries is not None and state.prefix_queries > 0


def test_sglang_page_maps_usage_as_mean_and_counts_as_sums() -> None:
    """SGLang: KV usage is the mean over data-parallel ranks, requests their sum."""
    state = read_state("sglang", SGLANG_PAGE)
    assert state.engine == "sglang"
    assert state.kv_cache_usage == pytest.approx((0.42 + 0.18) / 2)
    assert (state.running, state.waiting) == (3.0 + 2.0, 7.0 + 1.0)
    assert (state.prefix_queries, state.prefix_hits) == (48210.0, 29044.0)


def test_sglang_retractions_gauge_is_not_read_as_preemptions() -> None:
    """SGLang's retraction gauge is per batch, not a counter: preemptions stay absent."""
    assert read_state("sglang", SGLANG_PAGE).preemptions is None


def test_tgi_page_reports_only_batch_and_queue() -> None:
    """TGI: running is the batch size, waiting the queue; the rest is absent, not 0."""
    state = read_state("tgi", TGI_PAGE)
    assert (state.running, state.waiting) == (4.0, 6.0)
    assert state.reported() == {"running", "waiting"}
    assert state.kv_cache_usage is None and state.prefix_hits is None


def test_llamacpp_page_counts_lookups_as_processed_plus_cached() -> None:
    """llama.cpp (captured): lookups are processed + cached prompt tokens; no KV, no preemption."""
    state = read_state("llamacpp", LLAMACPP_PAGE)
    sums = parse_sums(LLAMACPP_PAGE)
    cached = sums.sum("llamacpp:prompt_tokens_cached_total")
    processed = sums.sum("llamacpp:prompt_tokens_total")
    assert cached is not None and processed is not None and cached > 0
    assert (state.prefix_hits, state.prefix_queries) == (cached, processed + cached)
    assert state.reported() == {"running", "waiting", "prefix_queries", "prefix_hits"}


@pytest.mark.parametrize(
    ("page", "engine"),
    [(VLLM_PAGE, "vllm"), (SGLANG_PAGE, "sglang"), (TGI_PAGE, "tgi"), (LLAMACPP_PAGE, "llamacpp")],
)
def test_auto_detects_the_engine_from_its_metric_names(page: str, engine: str) -> None:
    """``engine: auto`` picks the adapter whose metric prefix the page carries."""
    assert read_state("auto", page) == read_state(engine, page)
    detected = detect_page(page)
    assert detected is not None and detected.name == engine


def test_auto_on_a_page_of_no_known_engine_reports_nothing() -> None:
    """A page no adapter recognises gives an unknown engine with every value absent."""
    state = read_state("auto", "# TYPE other_thing gauge\nother_thing 3\n")
    assert state == unknown_state()
    assert state.reported() == frozenset()


def test_a_configured_engine_missing_from_the_page_is_absent_not_zero() -> None:
    """A pool configured as vLLM whose page lacks vLLM's samples reports no values."""
    assert read_state("vllm", TGI_PAGE).reported() == frozenset()


def test_adapters_report_no_more_than_they_declare() -> None:
    """Each adapter's declared fields cover what it reads from every capture."""
    for adapter in ADAPTERS.values():
        for page in (VLLM_PAGE, SGLANG_PAGE, TGI_PAGE, LLAMACPP_PAGE):
            assert read_state(adapter.name, page).reported() <= adapter.reports
    assert reports("auto") == frozenset(STATE_FIELDS)
    assert reports("llamacpp") == {"running", "waiting", "prefix_queries", "prefix_hits"}


def test_unreadable_page_raises_one_line_error() -> None:
    """A page that is not the Prometheus text format is an ExpositionError."""
    with pytest.raises(ExpositionError, match="unreadable /metrics page"):
        read_state("tgi", "tgi_queue_size{le=\n")


@given(st.lists(st.tuples(st.sampled_from("abc"), st.floats(-1e6, 1e6)), max_size=30))
def test_sums_add_by_name_and_mean_divides_by_label_sets(samples: list[tuple[str, float]]) -> None:
    """Sums.sum is the per-name total, Sums.mean that over the name's sample count."""
    sums = Sums.of(samples)
    for name in "abc":
        values = [v for n, v in samples if n == name]
        if not values:
            assert sums.sum(name) is None and sums.mean(name) is None
            continue
        assert sums.sum(name) == pytest.approx(sum(values))
        assert sums.mean(name) == pytest.approx(sum(values) / len(values))


@given(st.lists(st.one_of(st.none(), st.floats(-1e6, 1e6)), max_size=5))
def test_plus_is_absent_when_any_part_is(values: list[float | None]) -> None:
    """plus() of values is their sum, or None as soon as one is absent."""
    expected = None if None in values else sum(v for v in values if v is not None)
    assert plus(*values) == (None if expected is None else pytest.approx(expected))


def test_nan_samples_are_left_out() -> None:
    """A NaN sample (no value yet) is not summed and alone leaves the value absent."""
    assert Sums.of([("a", float("nan"))]).sum("a") is None
    assert Sums.of([("a", float("nan")), ("a", 2.0)]).mean("a") == 2.0


def _exported(snapshot: dict[tuple[str, str], EngineState | None]) -> dict[str, list[dict]]:
    registry = CollectorRegistry()
    registry.register(PoolStateCollector(lambda: snapshot))
    out: dict[str, list[dict]] = {}
    for family in registry.collect():
        for s in family.samples:
            out.setdefault(s.name, []).append({**s.labels, "value": s.value})
    return out


def test_collector_exports_no_series_for_values_the_engine_does_not_report() -> None:
    """A TGI replica exports running/waiting and its engine, but no KV or cache series."""
    exported = _exported(
        {("g", "http://t:1"): read_state("tgi", TGI_PAGE), ("v", "http://v:1"): None}
    )
    assert [r["pool"] for r in exported["vllm_obs_pool_up"]] == ["g", "v"]
    assert exported["vllm_obs_pool_requests_running"] == [
        {"pool": "g", "replica": "http://t:1", "value": 4.0}
    ]
    assert exported["vllm_obs_pool_engine_info"][0]["engine"] == "tgi"
    for absent in (
        "vllm_obs_pool_kv_cache_usage_ratio",
        "vllm_obs_pool_prefix_cache_hits_total",
        "vllm_obs_pool_preemptions_total",
    ):
        assert absent not in exported


def test_config_names_the_engine_field_on_a_bad_engine() -> None:
    """An unknown ``engine:`` is refused with the field and the engines that exist."""
    config: dict[str, Any] = {
        "pools": [{"name": "a", "replicas": ["http://10.0.0.1:8000"], "engine": "ollama"}],
        "lanes": [{"name": "l", "pool": "a"}],
        "default_lane": "l",
    }
    with pytest.raises(ConfigError, match=r"pools\.0\.engine: .*'tgi' or 'sim'"):
        parse_config(config)
    config["pools"][0].pop("engine")
    assert parse_config(config).pools[0].engine == "auto"


def test_adapters_declare_exactly_what_their_mapping_reads() -> None:
    """``reports`` is what ``read`` gives from a page with every wanted sample: no second list."""
    declared = {name: sorted(a.reports) for name, a in ADAPTERS.items()}
    assert declared == {
        "vllm": sorted(STATE_FIELDS),
        "sglang": ["kv_cache_usage", "prefix_hits", "prefix_queries", "running", "waiting"],
        "llamacpp": ["prefix_hits", "prefix_queries", "running", "waiting"],
        "tgi": ["running", "waiting"],
        "sim": sorted(STATE_FIELDS),
    }
    for adapter in ADAPTERS.values():
        narrow = dataclasses.replace(adapter, wants=adapter.wants[:1])
        assert narrow.reports < adapter.reports or len(adapter.wants) == 1
