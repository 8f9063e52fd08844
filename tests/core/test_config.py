"""The lanes config: the shipped default loads, and broken configs say what to fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from obs.config import default_config_path, load_config
from obs.errors import ConfigError

GOOD = {
    "pools": [{"name": "p", "replicas": ["http://127.0.0.1:8001"]}],
    "lanes": [{"name": "chat", "pool": "p"}],
    "default_lane": "chat",
}


def _write(tmp_path: Path, data: object) -> Path:
    p = tmp_path / "lanes.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_default_config_has_six_lanes_on_two_pools() -> None:
    """The shipped config covers the six request classes."""
    cfg = load_config(default_config_path())
    assert sorted(cfg.lane_names) == sorted(
        ["chat", "rag", "long-prefill", "agent", "batch", "slow-stream"]
    )
    assert [p.name for p in cfg.pools] == ["interactive", "bulk"]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["lanes"][0].update(colour="red"), "lanes.0.colour: unknown key"),
        (lambda d: d["lanes"][0].update(pool="nope"), "unknown pool 'nope'"),
        (lambda d: d["pools"][0].update(replicas=["localhost:8001"]), "not an http(s) URL"),
        (
            lambda d: d["lanes"].append({"name": "chat", "pool": "p"}),
            "duplicate lane name(s): chat",
        ),
        (
            lambda d: d["lanes"][0].update(admission={"max_concurrency": -1}),
            "lanes.0.admission.max_concurrency: Input should be greater than 0",
        ),
        (lambda d: d.update(default_lane="other"), "default_lane 'other' is not a lane"),
        (
            lambda d: d["lanes"][0].update(admission={"slow_client": {"record_wait_s": 0.5}}),
            "lane 'chat': admission.slow_client.record_wait_s (0.5 s) is below "
            "recognition.slow_stream_ms (1000 ms)",
        ),
    ],
)
def test_broken_config_names_file_field_and_problem(
    tmp_path: Path, mutate: object, expected: str
) -> None:
    """Each kind of mistake gets an error naming the file and what is wrong."""
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    mutate(data)  # type: ignore[operator]
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert str(path) in str(exc.value)
    assert expected in str(exc.value)


@pytest.mark.process
def test_config_check_cli_reports_errors_without_traceback(tmp_path: Path) -> None:
    """`vllm-obs config check` exits 2 with the error and no Python traceback."""
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    data["lanes"][0]["pool"] = "missing"
    path = _write(tmp_path, data)
    r = subprocess.run(
        [sys.executable, "-m", "obs.cli", "config", "check", str(path)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2
    assert "unknown pool 'missing'" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.process
def test_config_check_cli_prints_resolved_lanes() -> None:
    """`vllm-obs config check` on the default prints pools, lanes, rules and SLOs."""
    r = subprocess.run(
        [sys.executable, "-m", "obs.cli", "config", "check"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert "chat -> pool interactive" in r.stdout
    assert "TTFT <= 500 ms for 95.0%" in r.stdout


def test_not_yaml_is_a_config_error(tmp_path: Path) -> None:
    """Unparseable YAML is reported as such, with the file name."""
    p = tmp_path / "bad.yaml"
    p.write_text("pools: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)


@pytest.mark.process
def test_config_check_warns_when_clients_may_set_their_priority(tmp_path: Path) -> None:
    """A lane naming priority.header is accepted with a warning that any client can use it;
    the shipped config (no header) gets none."""
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    data["lanes"][0]["priority"] = {"header": "x-priority", "tenants": {"gold": 7}}
    path = _write(tmp_path, data)
    r = subprocess.run(
        [sys.executable, "-m", "obs.cli", "config", "check", str(path)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert "warning:" in r.stderr and "x-priority header" in r.stderr
    assert "capped at their tenant's level" in r.stderr
    shipped = subprocess.run(
        [sys.executable, "-m", "obs.cli", "config", "check"], capture_output=True, text=True
    )
    assert "warning:" not in shipped.stderr
