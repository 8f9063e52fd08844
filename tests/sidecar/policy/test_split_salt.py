"""The split salt (issue 38): from the environment, else a file made once and kept."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from obs import splits
from obs.config import parse_config
from obs.errors import ConfigError
from obs.sidecar.cli.hardening import SALT_FILE, split_salt

SPLIT = parse_config(
    {
        "version": 1,
        "pools": [{"name": "a", "replicas": ["http://127.0.0.1:1"]},
                  {"name": "b", "replicas": ["http://127.0.0.1:2"]}],
        "lanes": [{"name": "chat", "split": {"a": 95, "b": 5}}],
        "default_lane": "chat",
    }
)  # fmt: skip


def test_a_salt_is_made_once_and_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the variable, the first start writes a random salt (0600) beside the events
    file; the next start (a restart, another worker) reads the same one."""
    monkeypatch.delenv(splits.SALT_ENV, raising=False)
    events = tmp_path / "events.jsonl"
    first = split_salt(None, events, SPLIT)
    assert len(first) >= 32 and first == split_salt(None, events, SPLIT)
    assert stat.S_IMODE((tmp_path / SALT_FILE).stat().st_mode) == 0o600
    other = tmp_path / "elsewhere"
    other.mkdir()
    assert split_salt(None, other / "events.jsonl", SPLIT) != first  # a new random one


def test_the_variable_wins_and_must_be_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """VLLM_OBS_SPLIT_SALT is the salt (shared by a fleet); a short one is refused clearly."""
    monkeypatch.setenv(splits.SALT_ENV, "s" * 40)
    assert split_salt(None, tmp_path / "e.jsonl", SPLIT) == b"s" * 40
    monkeypatch.setenv(splits.SALT_ENV, "short")
    with pytest.raises(ConfigError, match="at least 16"):
        split_salt(None, tmp_path / "e.jsonl", SPLIT)


def test_no_split_needs_no_salt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A config without a split lane writes nothing."""
    monkeypatch.delenv(splits.SALT_ENV, raising=False)
    plain = parse_config(
        {
            "version": 1,
            "pools": [{"name": "a", "replicas": ["http://x:1"]}],
            "lanes": [{"name": "chat", "pool": "a"}],
            "default_lane": "chat",
        }
    )
    assert split_salt(None, tmp_path / "e.jsonl", plain) == b""
    assert not (tmp_path / SALT_FILE).exists()


def test_without_an_events_file_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No events file and no --split-salt-file: a salt of this run's own, no file anywhere."""
    monkeypatch.delenv(splits.SALT_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert len(split_salt(None, None, SPLIT)) >= 32
    assert not list(tmp_path.iterdir())
