"""Declared engine settings: the one ``engine:`` block, its place in fingerprints and changes,
drift against what the engine reports, and what ``engine serve`` declares."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from obs.config import default_config_path, load_config, parse_config
from obs.engines.declare import declared_flags, engine_block
from obs.errors import ConfigError
from obs.served import DECLARED_KEYS, ChangeTracker, Served, drift, merge
from obs.sweep.profile import parse_profile


def _config(engine: object) -> dict[str, Any]:
    pool = {"name": "main", "replicas": ["http://127.0.0.1:8000"], "engine": engine}
    return {"pools": [pool], "lanes": [{"name": "l", "pool": "main"}], "default_lane": "l"}


def test_engine_block_carries_kind_and_flags() -> None:
    """`engine: {kind: vllm, max_num_seqs: 64}` gives the kind and the declared flags."""
    pool = parse_config(_config({"kind": "vllm", "max_num_seqs": 64})).pools[0]
    assert pool.engine == "vllm"
    assert pool.declared is not None and pool.declared.values() == {"max_num_seqs": 64}


def test_engine_kind_alone_is_still_accepted() -> None:
    """`engine: vllm` still parses, declaring nothing."""
    pool = parse_config(_config("vllm")).pools[0]
    assert (pool.engine, pool.declared) == ("vllm", None)


def test_engine_block_round_trips_in_one_shape() -> None:
    """A dumped config writes the one engine block back, and parses to the same config."""
    config = parse_config(_config({"kind": "llamacpp", "max_num_seqs": 4}))
    data = config.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    assert data["pools"][0]["engine"] == {"kind": "llamacpp", "max_num_seqs": 4}
    assert "declared" not in data["pools"][0]
    assert parse_config(data) == config


def test_a_config_without_declarations_keeps_its_fingerprint_text() -> None:
    """The canonical JSON of a config that declares nothing has no `declared` key."""
    assert '"declared"' not in load_config(default_config_path()).model_dump_json()


@pytest.mark.parametrize(
    ("engine", "field"),
    [
        ({"kind": "vllm", "max_num_seq": 64}, "pools.0.engine.max_num_seq: unknown key"),
        ({"kind": "vllm", "max_num_seqs": 0}, "pools.0.engine.max_num_seqs"),
        ({"kind": "vlm"}, "pools.0.engine"),
    ],
)
def test_bad_declarations_name_the_field(engine: object, field: str) -> None:
    """A typo, a non-positive flag or an unknown kind fails naming the engine block's field."""
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        parse_config(_config(engine))


def test_profile_engine_block_is_declared_to_the_sidecar() -> None:
    """A sweep profile's engine flags reach its lanes config as the pool's declaration."""
    profile = parse_profile(
        {
            "name": "p",
            "pools": [{"name": "main", "engine": {"kind": "vllm", "max_num_seqs": 16}}],
            "lanes": [{"name": "l", "pool": "main"}],
            "default_lane": "l",
        }
    )
    pool = profile.lanes_config({"main": ["http://127.0.0.1:9"]})["pools"][0]
    assert pool["engine"] == {"kind": "vllm", "max_num_seqs": 16, "prefix_caching": True}
    assert profile.engines["main"].vllm_args() == ["--max-num-seqs", "16"]


def test_profile_engine_kind_alone_is_accepted() -> None:
    """`engine: vllm` in a profile pool means vLLM with its default flags."""
    profile = parse_profile(
        {
            "name": "p",
            "pools": [{"name": "main", "engine": "vllm"}],
            "lanes": [{"name": "l", "pool": "main"}],
            "default_lane": "l",
        }
    )
    assert profile.engines["main"].vllm_args() == []


def test_a_declared_restart_is_a_change_naming_the_flag() -> None:
    """Declared max_num_seqs 64 then 128 on one replica: one change naming max_num_seqs."""
    tracker = ChangeTracker()
    reported = {"version": "0.32.0", "prefix_caching": "true"}
    key = ("bulk", "http://r:1")
    first = merge("vllm", (reported, {"max_num_seqs": 64}))
    second = merge("vllm", (reported, {"max_num_seqs": 128}))
    assert tracker.observe(key, first, 1.0) is None
    change = tracker.observe(key, second, 2.0)
    assert change is not None
    assert (change.changed, change.old, change.new) == (
        ("max_num_seqs",),
        "max_num_seqs=64",
        "max_num_seqs=128",
    )
    assert first.fingerprint != second.fingerprint


def test_what_the_engine_reports_wins_over_the_declaration() -> None:
    """A setting both reported and declared takes the reported value (drift shows the rest)."""
    served = merge("vllm", ({"prefix_caching": "false"}, {"prefix_caching": True}))
    assert dict(served.settings)["prefix_caching"] == "false"


def test_drift_compares_only_what_both_sides_say() -> None:
    """Declared max_num_seqs against llama.cpp's slots and vLLM's own name; nothing unreported."""
    assert drift({"max_running": "4"}, {"max_num_seqs": 64}) == {"max_num_seqs": True}
    assert drift({"max_num_seqs": "64"}, {"max_num_seqs": 64}) == {"max_num_seqs": False}
    assert drift({"context_tokens": "2048"}, {"max_model_len": 2048}) == {"max_model_len": False}
    assert drift({"version": "1"}, {"max_num_seqs": 64, "stream_interval": 2}) == {}
    assert drift({"prefix_caching": "true"}, {"prefix_caching": False}) == {"prefix_caching": True}


@given(
    st.dictionaries(st.sampled_from(DECLARED_KEYS), st.integers(1, 10**6)),
    st.dictionaries(st.sampled_from(DECLARED_KEYS), st.integers(1, 10**6)),
)
def test_drift_is_set_exactly_where_values_differ(
    declared: dict[str, int], reported: dict[str, int]
) -> None:
    """Drift has a key per setting on both sides, true exactly where the values differ."""
    out = drift({k: str(v) for k, v in reported.items()}, declared)
    assert out == {k: declared[k] != reported[k] for k in declared.keys() & reported.keys()}


def test_declared_settings_are_info_labels() -> None:
    """Declared flags are setting names of the info series, in the fingerprint."""
    served = Served.of("vllm", {"max_num_seqs": 64, "long_prefill_token_threshold": 4096})
    assert dict(served.settings) == {"max_num_seqs": "64", "long_prefill_token_threshold": "4096"}


def test_engine_serve_declares_what_it_passed() -> None:
    """The launcher's arguments become the engine block, last flag winning, others ignored."""
    args = ["--max-num-seqs", "8", "--port", "1", "--max-num-seqs=64", "--no-enable-prefix-caching"]
    declared = declared_flags(args, max_model_len=2048)
    assert declared.values() == {"max_num_seqs": 64, "max_model_len": 2048, "prefix_caching": False}
    block = engine_block(declared)
    assert block.startswith("engine: {kind: vllm, max_num_seqs: 64")
    assert parse_config(_config(yaml.safe_load(block)["engine"])).pools[0].declared == declared


def test_a_flag_value_that_is_no_ascii_number_is_not_declared() -> None:
    """`--max-num-seqs ²` (a digit to str.isdigit, not to int) is ignored, not a crash."""
    declared = declared_flags(["--max-num-seqs", "\u00b2"], max_model_len=2048)
    assert declared.values() == {"max_model_len": 2048}
