"""The committed dashboards are what the default config generates; the CLI writes and checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from obs.cli import main
from obs.config import default_config_path, load_config
from obs.dashboards.build import files

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "deploy" / "grafana" / "dashboards"


def test_committed_dashboards_match_the_default_config() -> None:
    """deploy/grafana/dashboards/ holds exactly the regenerated JSON (run `vllm-obs dashboards`)."""
    expected = files(load_config(default_config_path()))
    present = {p.name for p in COMMITTED.glob("*.json")}
    assert present == set(expected), (
        "regenerate: vllm-obs dashboards --out deploy/grafana/dashboards"
    )
    for name, text in expected.items():
        assert (COMMITTED / name).read_text(encoding="utf-8") == text, (
            f"{name} is stale; regenerate: vllm-obs dashboards --out deploy/grafana/dashboards"
        )


def test_cli_writes_then_check_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`dashboards --out DIR` writes one JSON per dashboard; `--check` then exits 0."""
    assert main(["dashboards", "--out", str(tmp_path)]) == 0
    written = sorted(tmp_path.glob("*.json"))
    assert len(written) == 5
    assert sorted(capsys.readouterr().out.split()) == [str(p) for p in written]
    for path in written:
        assert json.loads(path.read_text(encoding="utf-8"))["uid"] == path.stem
    assert main(["dashboards", "--out", str(tmp_path), "--check"]) == 0


def test_cli_check_fails_on_a_stale_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--check` exits 1 and names the file when a dashboard differs or is missing."""
    main(["dashboards", "--out", str(tmp_path)])
    (tmp_path / "vllm-obs-slo.json").write_text("{}\n", encoding="utf-8")
    (tmp_path / "vllm-obs-lane.json").unlink()
    capsys.readouterr()
    assert main(["dashboards", "--out", str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert "vllm-obs-slo.json" in err and "vllm-obs-lane.json" in err


def test_cli_config_option_changes_the_output(tmp_path: Path) -> None:
    """`--config FILE` generates from that file: its lanes are the lane variable's options."""
    config = tmp_path / "lanes.yaml"
    config.write_text(
        "pools: [{name: p, replicas: ['http://127.0.0.1:9']}]\n"
        "lanes: [{name: only, pool: p}]\ndefault_lane: only\n",
        encoding="utf-8",
    )
    out = tmp_path / "out"
    assert main(["dashboards", "--config", str(config), "--out", str(out)]) == 0
    board = json.loads((out / "vllm-obs-overview.json").read_text(encoding="utf-8"))
    lane = next(v for v in board["templating"]["list"] if v["name"] == "lane")
    assert lane["query"] == "only"


def test_cli_bad_config_names_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An invalid config exits 2 with an error that names the field; nothing is written."""
    config = tmp_path / "lanes.yaml"
    config.write_text(
        "pools: [{name: p, replicas: ['http://127.0.0.1:9']}]\n"
        "lanes: [{name: only, pool: nope}]\ndefault_lane: only\n",
        encoding="utf-8",
    )
    out = tmp_path / "out"
    assert main(["dashboards", "--config", str(config), "--out", str(out)]) == 2
    assert "nope" in capsys.readouterr().err
    assert not out.exists()
