"""What a replica runs: settings from each engine's pages, fingerprints and change tracking."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from obs import conventions as c
from obs.exporters.served import ServedCollector
from obs.served import (
    SETTING_KEYS,
    ChangeTracker,
    Served,
    change_between,
    merge,
    page_settings,
    vllm_cache_settings,
)
from obs.sidecar.pools.engine_scrape import page_settings as metrics_settings
from obs.sidecar.server.worker_metrics import merge_pages

REFERENCE = Path(__file__).parents[2] / "tests" / "data" / "vllm-0.32-cpu-metrics.txt"
CACHE_LINE = (
    'vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",'
    'engine="0",kv_cache_size_tokens="1048576",num_cpu_blocks="None"} 1.0\n'
)


def test_vllm_settings_come_from_cache_config_info_labels():
    """vLLM's /metrics page gives block size, prefix caching, KV dtype and KV size in tokens."""
    page = "# HELP vllm:cache_config_info x\n# TYPE vllm:cache_config_info gauge\n" + CACHE_LINE
    got = merge(
        "vllm", [metrics_settings("vllm", page), page_settings("vllm", {"version": "0.32.0"})]
    )
    assert got.as_dict() == {
        "engine": "vllm",
        "version": "0.32.0",
        "block_size": "128",
        "prefix_caching": "true",
        "kv_cache_dtype": "auto",
        "kv_cache_tokens": "1048576",
    }


def test_other_engines_pages_map_to_the_same_names():
    """llama.cpp /props, TGI /info and SGLang /get_server_info fill the neutral setting names."""
    props = {
        "build_info": "b1-abc",
        "total_slots": 4,
        "default_generation_settings": {"n_ctx": 512},
    }
    assert merge("llamacpp", [page_settings("llamacpp", props)]).as_dict() == {
        "engine": "llamacpp", "version": "b1-abc", "max_running": "4", "context_tokens": "512",
    }  # fmt: skip
    info = {"version": "3.0.1", "max_concurrent_requests": 128, "max_batch_total_tokens": None}
    assert merge("tgi", [page_settings("tgi", info)]).as_dict() == {
        "engine": "tgi", "version": "3.0.1", "max_running": "128",
    }  # fmt: skip
    server = {
        "version": "0.4",
        "disable_radix_cache": True,
        "page_size": 1,
        "kv_cache_dtype": "auto",
    }
    assert merge("sglang", [page_settings("sglang", server)]).as_dict()["prefix_caching"] == "false"


def test_unreported_settings_are_absent_never_empty():
    """None, "None", "" and nested values leave the setting out instead of an empty label."""
    served = Served.of("vllm", {"block_size": "None", "version": "", "max_running": {"a": 1}})
    assert served.settings == ()
    assert vllm_cache_settings({"num_cpu_blocks": "None"}) == {}
    assert metrics_settings("llamacpp", CACHE_LINE) == {}
    assert metrics_settings("vllm", "not a page {") == {}


def test_reference_page_of_a_real_vllm_reads():
    """The captured /metrics page of a real vLLM 0.32 on CPU yields its cache settings."""
    got = metrics_settings("vllm", REFERENCE.read_text())
    assert got["prefix_caching"] == "True"
    assert got["block_size"] == "128" and got["kv_cache_tokens"] == "1048576"


values = st.dictionaries(
    st.sampled_from(SETTING_KEYS), st.text(min_size=1, max_size=80).filter(str.strip), max_size=8
)


@given(values, values)
def test_fingerprint_changes_exactly_when_a_setting_does(a, b):
    """Two settings have one fingerprint iff they are equal; a change names only what differs."""
    old, new = Served.of("vllm", a), Served.of("vllm", b)
    change = change_between(("p", "r"), old, new)
    assert (change is None) == (old == new)  # (a 32-bit fingerprint collision aside)
    if change is not None:
        assert change.changed and set(change.changed) <= {"engine", *SETTING_KEYS}
        assert all(len(v) <= 64 for _, v in new.settings)


def test_a_non_ascii_digit_reads_as_no_slot_count():
    """max_num_seqs '²' passes str.isdigit() but is no number: no slots, no crash."""
    assert Served.of("vllm", {"max_num_seqs": "\u00b2"}).max_running is None
    assert Served.of("vllm", {"max_num_seqs": "\u0664"}).max_running is None  # Arabic-Indic 4
    assert Served.of("vllm", {"max_num_seqs": "64"}).max_running == 64


def test_tracker_ignores_restarts_without_a_change():
    """The same settings again (a restart, a reload) make no change; other settings make one."""
    tracker = ChangeTracker()
    on = Served.of("vllm", {"prefix_caching": "True", "version": "0.32.0"})
    off = Served.of("vllm", {"prefix_caching": "False", "version": "0.32.0"})
    assert tracker.observe(("p", "r"), on, 1.0) is None
    assert tracker.observe(("p", "r"), on, 2.0) is None
    change = tracker.observe(("p", "r"), off, 3.0)
    assert change is not None and change.changed == ("prefix_caching",)
    assert (change.old, change.new) == ("prefix_caching=true", "prefix_caching=false")
    assert tracker.changes == {("p", "r"): (change, 3.0)}
    assert tracker.observe(("p", "other"), off, 4.0) is None  # a new replica: no change


def _page(collector: ServedCollector) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


def test_collector_exports_only_reported_settings_and_the_last_change():
    """The info sample has a label per reported setting only; the change holds old and new."""
    tracker = ChangeTracker()
    key = ("gpu", "http://r:8000")
    tracker.observe(key, Served.of("vllm", {"prefix_caching": "False"}), 1.0)
    tracker.observe(key, Served.of("vllm", {"prefix_caching": "True", "version": "0.32"}), 7.5)
    served = {key: tracker.last[key], ("cpu", "http://l:8080"): Served.of("llamacpp", {})}
    page = _page(ServedCollector(lambda: served, lambda: tracker.changes, ("abcd0123", "1")))
    samples = {
        (s.name, s.labels.get(c.POOL)): s
        for fam in text_string_to_metric_families(page)
        for s in fam.samples
    }
    gpu = samples[(c.POOL_SETTINGS_INFO.name, "gpu")].labels
    assert gpu == {
        c.POOL: "gpu", c.REPLICA: "http://r:8000", c.ENGINE: "vllm",
        c.FINGERPRINT: tracker.last[key].fingerprint, "prefix_caching": "true", "version": "0.32",
    }  # fmt: skip
    cpu = samples[(c.POOL_SETTINGS_INFO.name, "cpu")].labels
    assert set(cpu) == {c.POOL, c.REPLICA, c.ENGINE, c.FINGERPRINT}  # nothing reported: no label
    change = samples[(c.POOL_SETTINGS_CHANGED.name, "gpu")]
    assert change.value == 7.5
    assert change.labels[c.CHANGED] == "version,prefix_caching"
    assert change.labels[c.OLD] == "version=- prefix_caching=false"
    assert change.labels[c.NEW] == "version=0.32 prefix_caching=true"
    assert (c.POOL_SETTINGS_CHANGED.name, "cpu") not in samples
    config = samples[(c.CONFIG_INFO.name, None)]
    assert config.labels == {c.CONFIG_HASH: "abcd0123", c.CONFIG_VERSION: "1"} and config.value == 1


def test_workers_merge_takes_the_settings_and_config_series_once():
    """Each worker exports the same info series: the merged page has them once, value 1."""
    served = {("gpu", "http://r:8000"): Served.of("vllm", {"version": "0.32"})}
    page = _page(ServedCollector(lambda: served, dict, ("abcd0123", "1")))
    merged = {s.name: s.value for fam in merge_pages([page, page, page]) for s in fam.samples}
    assert merged[c.POOL_SETTINGS_INFO.name] == 1.0 and merged[c.CONFIG_INFO.name] == 1.0
