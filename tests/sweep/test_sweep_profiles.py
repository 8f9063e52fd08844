"""Sweep profiles and the matrix's pure parts: parsing, validation, flags, verdicts, tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from obs.config import default_config_path, load_config, parse_config
from obs.errors import ConfigError
from obs.sweep.matrix import best_per_lane, gate_verdict, profile_verdict
from obs.sweep.profile import (
    FLAGS,
    SHIPPED,
    EngineFlags,
    check_same_gates,
    parse_profile,
    resolve,
)

DEFAULT = load_config(default_config_path())


def _profile(**over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "mine",
        "base_lanes": "default",
        "pools": [{"name": "main", "engine": {"max_num_seqs": 8}}],
        "lanes": {lane: {"pool": "main"} for lane in DEFAULT.lane_names},
    }
    data.update(over)
    return data


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "obs.cli", *args], capture_output=True, text=True, check=False
    )


# --- the shipped profiles ------------------------------------------------------------------


def test_every_shipped_profile_is_valid_and_serves_the_six_lanes() -> None:
    """Each shipped profile parses, keeps the six default lanes and routes each to its pools."""
    for name in SHIPPED:
        profile = resolve(name)
        assert profile.name == name
        assert profile.config.lane_names == DEFAULT.lane_names
        assert set(profile.engines) == {p.name for p in profile.config.pools}
        assert {lane.pool for lane in profile.config.lanes} == set(profile.engines)


def test_shipped_profiles_gate_every_lane_like_the_default_lanes() -> None:
    """Profiles differ in pools and routing, never in the lanes' SLOs (the gates)."""
    profiles = [resolve(n) for n in SHIPPED]
    check_same_gates(profiles)
    for profile in profiles:
        assert [lane.slo for lane in profile.config.lanes] == [lane.slo for lane in DEFAULT.lanes]


def test_shipped_profiles_give_the_same_kv_cache_in_total() -> None:
    """Every shipped profile holds 96 MiB of KV cache over its replicas (docs/sweep.md)."""
    for name in SHIPPED:
        engines = resolve(name).engines.values()
        assert sum((e.kv_cache_mib or 0) * e.replicas for e in engines) == 96, name


def test_class_aware_is_the_shipped_lanes_config() -> None:
    """class-aware routes every lane as obs/data/lanes.yaml does."""
    profile = resolve("class-aware")
    assert profile.config.lanes == DEFAULT.lanes
    assert [p.name for p in profile.config.pools] == [p.name for p in DEFAULT.pools]


def test_prefix_routing_routes_every_lane_by_prefix_over_two_replicas() -> None:
    """prefix-routing: one pool of two replicas, prefix affinity for every lane."""
    profile = resolve("prefix-routing")
    assert {lane.routing for lane in profile.config.lanes} == {"prefix_affinity"}
    assert [e.replicas for e in profile.engines.values()] == [2]


# --- validation: errors name the field -------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"pools": [{"name": "main", "engine": {"max_num_seq": 8}}]}, "pools.0.engine.max_num_seq"),
        (
            {
                "pools": [
                    {"name": "main", "engine": {"max_num_seqs": 64, "max_num_batched_tokens": 32}}
                ]
            },
            "max_num_batched_tokens (32) must be at least max_num_seqs (64)",
        ),
        (
            {"pools": [{"name": "main", "engine": {"max_long_partial_prefills": 2}}]},
            "max_long_partial_prefills (2) must not exceed max_num_partial_prefills",
        ),
        ({"pools": [{"name": "main", "engine": {"replicas": 0}}]}, "pools.0.engine.replicas"),
        ({"lanes": {"chta": {"pool": "main"}}}, "lanes.chta: no such lane"),
        ({"lanes": {"chat": {"pool": "nope"}}}, "unknown pool 'nope'"),
        ({"name": "Bad Name"}, "name:"),
        ({"base_lanes": None}, "lanes: give a list of lanes"),
    ],
)
def test_a_bad_profile_fails_with_the_field_named(change: dict[str, Any], named: str) -> None:
    """A typo or an impossible setting is refused with a message naming the field."""
    data = _profile(**change)
    if "lanes" in change and change["lanes"].keys() != set(DEFAULT.lane_names):
        data["lanes"] = {**_profile()["lanes"], **change["lanes"]}
    with pytest.raises(ConfigError) as err:
        parse_profile(data, "p.yaml")
    assert named in str(err.value)
    assert str(err.value).startswith("p.yaml")


@pytest.mark.process
def test_config_check_validates_a_profile_file(tmp_path: Path) -> None:
    """`vllm-obs config check` takes a profile: ok prints its engines, a typo exits 2 naming it."""
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(_profile()))
    ok = _cli("config", "check", str(good))
    assert ok.returncode == 0, ok.stderr
    assert "sweep profile mine" in ok.stdout and "main: --max-num-seqs 8" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_profile(pools=[{"name": "main", "engine": {"max_num_seq": 8}}])))
    proc = _cli("config", "check", str(bad))
    assert proc.returncode == 2
    assert "pools.0.engine.max_num_seq: unknown key" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.process
def test_sweep_refuses_a_bad_profile_before_starting_anything(tmp_path: Path) -> None:
    """`vllm-obs sweep --profile BAD` exits 2 naming the field and creates no output folder."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(_profile(pools=[{"name": "main", "engine": {"stream_interval": 0}}]))
    )
    out = tmp_path / "out"
    proc = _cli("sweep", "--profile", str(bad), "--out", str(out))
    assert proc.returncode == 2
    assert "pools.0.engine.stream_interval" in proc.stderr
    assert not out.exists()


@pytest.mark.process
@pytest.mark.parametrize("flag", ["--rounds", "--duration", "--rate", "--sessions"])
def test_sweep_refuses_non_positive_numbers(flag: str, tmp_path: Path) -> None:
    """Zero rounds, duration, rate or sessions is refused with the flag named."""
    proc = _cli("sweep", flag, "0", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert flag in proc.stderr


def test_profiles_that_gate_a_lane_differently_are_refused() -> None:
    """Two profiles with different TTFT SLOs for one lane cannot share a matrix."""
    other = _profile(name="other")
    other["lanes"]["chat"] = {"pool": "main", "slo": {"ttft": {"threshold_ms": 100}}}
    with pytest.raises(ConfigError, match="lane 'chat' different TTFT/TPOT SLOs"):
        check_same_gates([parse_profile(_profile()), parse_profile(other)])


def test_a_full_lanes_list_works_without_base_lanes() -> None:
    """Without base_lanes a profile carries its own lanes list, as in a lanes config."""
    data = {
        "name": "own",
        "pools": [{"name": "p", "engine": {}}],
        "lanes": [{"name": "all", "pool": "p", "slo": {"ttft": {"threshold_ms": 300}}}],
        "default_lane": "all",
    }
    profile = parse_profile(data)
    assert profile.config.lane_names == ["all"]
    assert profile.gates()["all"][0].threshold_ms == 300


def test_lanes_config_fills_in_the_replicas_and_keeps_the_rest() -> None:
    """The lanes config written for a run is the profile's, with the pools' URLs filled in."""
    profile = resolve("small-interactive")
    urls = {"interactive": ["http://127.0.0.1:9001"], "shared": ["http://127.0.0.1:9002"]}
    config = parse_config(profile.lanes_config(urls))
    assert {p.name: p.replicas for p in config.pools} == urls
    assert config.lanes == profile.config.lanes


def test_external_replicas_are_kept_from_the_file() -> None:
    """Replica URLs given in a profile are what --external uses."""
    data = _profile(pools=[{"name": "main", "replicas": ["http://10.0.0.5:8000"]}])
    assert parse_profile(data).external == {"main": ["http://10.0.0.5:8000"]}


# --- engine flags ------------------------------------------------------------------------------


def test_prefix_caching_off_adds_the_negative_flag() -> None:
    """prefix_caching: false passes --no-enable-prefix-caching (after the launcher's own flag)."""
    assert EngineFlags(prefix_caching=False).vllm_args() == ["--no-enable-prefix-caching"]
    assert EngineFlags().vllm_args() == []


@given(
    st.fixed_dictionaries(
        {}, optional={field: st.integers(min_value=1, max_value=1 << 20) for field in FLAGS}
    )
)
def test_every_set_flag_becomes_its_vllm_argument(values: dict[str, int]) -> None:
    """Each set scheduler field appears once as `--flag value`; unset ones not at all."""
    values = dict(values)
    if "max_long_partial_prefills" in values:
        values["max_num_partial_prefills"] = max(
            values["max_long_partial_prefills"], values.get("max_num_partial_prefills", 1)
        )
    if "max_num_batched_tokens" in values and "max_num_seqs" in values:
        values["max_num_batched_tokens"] = max(
            values["max_num_batched_tokens"], values["max_num_seqs"]
        )
    args = EngineFlags.model_validate(values).vllm_args()
    pairs = dict(zip(args[::2], args[1::2], strict=True))
    assert pairs == {FLAGS[k]: str(v) for k, v in values.items()}


# --- the matrix's verdicts and tests --------------------------------------------------------


def test_gate_verdict_names_the_gates_missed() -> None:
    """A lane row's verdict lists the SLOs it misses; none judged means no gate."""
    assert gate_verdict({"ttft_slo_met": False, "tpot_slo_met": True}) == ("misses TTFT", ["TTFT"])
    assert gate_verdict({"ttft_slo_met": True, "availability_slo_met": True})[0] == "met"
    assert gate_verdict({"ttft_slo_met": None})[0] == "no gate"


def test_profile_verdict_lists_lanes_and_gates() -> None:
    """A profile's verdict line names each lane and gate it misses."""
    rows = [{"lane": "chat", "_missed": ["TTFT", "TPOT"]}, {"lane": "rag", "_missed": []}]
    assert profile_verdict(rows) == "misses chat TTFT+TPOT"
    assert profile_verdict([{"lane": "rag", "_missed": []}]) == "meets every gate"


def _row(profile: str, good: int, n: int) -> dict[str, Any]:
    return {
        "profile": profile,
        "lane": "chat",
        "good": good,
        "requests": n,
        "goodput_share": good / n,
    }


def test_best_profile_is_a_tie_when_the_difference_is_noise() -> None:
    """9/10 against 8/10 is not told apart at alpha 0.01; 900/1000 against 500/1000 is."""
    tie = best_per_lane([_row("a", 8, 10), _row("b", 9, 10)], alpha=0.01)[0]
    assert tie["best"] == "b" and tie["runner_up"] == "a" and tie["significant"] is False
    real = best_per_lane([_row("a", 500, 1000), _row("b", 900, 1000)], alpha=0.01)[0]
    assert real["best"] == "b" and real["significant"] is True and real["p_value"] < 1e-9
