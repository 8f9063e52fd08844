"""The Python API: DataFrames that agree with the engine, flexible config and filter inputs."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import pytest

import obs.query as q
from obs.config import default_config_path, load_config
from obs.errors import InputError
from obs.query.testing import mixed_events, write_jsonl

pytestmark = pytest.mark.inproc


def test_summary_returns_a_dataframe_per_lane(mixed_log_path):
    """obs.query.summary(paths) -> DataFrame indexed by position, one row per lane."""
    df = q.summary(mixed_log_path)
    assert isinstance(df, pd.DataFrame)
    assert list(df["lane"]) == ["rag", "batch", "chat", "canary"]
    assert df.attrs["scan"]["malformed_total"] == 0


def test_config_accepts_a_path_or_a_config_object(mixed_log_path, tmp_path: Path):
    """config= takes a Config, a YAML path, or None for the shipped default."""
    by_default = q.summary(mixed_log_path)
    by_path = q.summary(mixed_log_path, config=default_config_path())
    by_object = q.summary(mixed_log_path, config=load_config(default_config_path()))
    pd.testing.assert_frame_equal(by_default, by_path)
    pd.testing.assert_frame_equal(by_default, by_object)


def test_filters_accept_a_dict_of_cli_style_values(mixed_log_path):
    """filters={"lane": ["chat"], "status": ["ok"]} works like the flags."""
    df = q.summary(mixed_log_path, filters={"lane": ["chat"], "status": ["ok"]})
    assert list(df["lane"]) == ["chat"] and list(df["requests"]) == [10]
    assert q.summary(mixed_log_path, filters=q.Filters(lanes=("rag",)))["requests"].tolist() == [7]


def test_other_api_functions_return_dataframes(mixed_log_path, tmp_path: Path):
    """slowest, timeline, compare and events return DataFrames; show a dict; report a path."""
    assert q.slowest(mixed_log_path, by="ttft", n=4).shape[0] == 4
    assert q.timeline(mixed_log_path, interval="1m")["requests"].sum() == 28
    cmp = q.compare(mixed_log_path, mixed_log_path)
    assert set(cmp.columns) >= {"lane", "metric", "before", "after", "p_value", "significant"}
    assert q.show(mixed_log_path, "req-0001")["lane"] == "chat"
    ev = q.events(mixed_log_path, filters={"lane": ["batch"]}, columns=["request_id", "prefill_ms"])
    assert list(ev.columns) == ["request_id", "prefill_ms"] and len(ev) == 5
    path = q.report(mixed_log_path, tmp_path / "rep")
    assert path.name == "report.html" and path.exists()
    assert q.export(mixed_log_path, tmp_path / "ds")["events"] == 28


def test_events_rejects_unknown_columns(mixed_log_path):
    """Asking events() for a field the schema lacks is an InputError."""
    with pytest.raises(InputError, match="unknown event field"):
        q.events(mixed_log_path, columns=["latency"])


def test_skipped_lines_are_logged_and_attached(tmp_path: Path, caplog):
    """Malformed lines show in df.attrs['scan'] and as a warning on the obs.query logger."""
    path = write_jsonl(tmp_path / "e.jsonl", mixed_events(), extra_lines=[b"{", b"{"])
    with caplog.at_level(logging.WARNING, logger="obs.query"):
        df = q.summary(path)
    assert df.attrs["scan"]["malformed"] == {str(path): 2}
    assert "skipped 2 malformed lines" in caplog.text


def test_unknown_api_name_raises_attribute_error():
    """obs.query exposes only its documented names."""
    with pytest.raises(AttributeError):
        q.nonexistent  # noqa: B018
