"""``query summary``: tokens per second per lane (prompt, generated, cached) and the cost per
1k tokens of a priced pool beside its API price."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from obs.config import Config, parse_config
from obs.query.aggregate import summary
from obs.query.scan import Scan
from obs.query.testing import event, ts, write_jsonl
from obs.query.throughput import COST_COLUMNS, RATE_COLUMNS

pytestmark = pytest.mark.inproc

LANES = [{"name": "chat", "pool": "gpu"}, {"name": "batch", "pool": "gpu"}]


def _config(price: dict[str, Any] | None = None, replicas: int = 1) -> dict[str, Any]:
    urls = [f"http://127.0.0.1:{8000 + i}" for i in range(replicas)]
    pool: dict[str, Any] = {"name": "gpu", "replicas": urls}
    if price is not None:
        pool["price"] = price
    return {"pools": [pool], "lanes": LANES, "default_lane": "chat"}


def _log(tmp_path: Path) -> str:
    """100 s of traffic: chat 10 requests (100 prompt, 20 out, 50 cached), batch 5 (1000, 200)."""
    events = [
        event(lane="chat", pool="gpu", ts=ts(10.0 * i), prompt_tokens=100, completion_tokens=20,
              cached_tokens=50)
        for i in range(11)
    ][:10] + [
        event(lane="batch", pool="gpu", ts=ts(25.0 * i), prompt_tokens=1000,
              completion_tokens=200, cached_tokens=0)
        for i in range(5)
    ]  # fmt: skip
    events.append(event(lane="chat", pool="gpu", ts=ts(100.0), prompt_tokens=0))
    return str(write_jsonl(tmp_path / "events.jsonl", events))


def _rows(path: str, config: Config) -> dict[str, dict[str, Any]]:
    table = summary(Scan(path), config, "lane")
    return {r[0]: dict(zip(table.columns, r, strict=True)) for r in table.rows}


def test_summary_prints_tokens_per_second_per_lane(tmp_path: Path) -> None:
    """Each lane's prompt, generated and cached tokens over the log's 100 s span."""
    rows = _rows(_log(tmp_path), parse_config(_config()))
    assert [rows["chat"][c] for c in RATE_COLUMNS] == [10.0, 2.0, 5.0]
    assert [rows["batch"][c] for c in RATE_COLUMNS] == [50.0, 10.0, 0.0]
    assert not set(COST_COLUMNS) & set(rows["chat"])  # no price, no cost column


def test_cost_per_1k_tokens_from_the_gpu_hour_price(tmp_path: Path) -> None:
    """2 replicas x 2 GPUs at 36/h for 100 s is 4 over 7200 tokens: 0.555556 per 1k."""
    price = {"gpu_hour": 36.0, "gpus_per_replica": 2, "api_per_1k_tokens": 0.5}
    rows = _rows(_log(tmp_path), parse_config(_config(price, replicas=2)))
    for lane in ("chat", "batch"):
        assert rows[lane]["cost_per_1k_tokens"] == pytest.approx(4 / 7.2, abs=1e-6)
        assert rows[lane]["api_cost_per_1k_tokens"] == 0.5


def test_a_single_instant_has_no_rate(tmp_path: Path) -> None:
    """A log of one instant has no span: rates and cost are absent, not zero or infinite."""
    path = str(write_jsonl(tmp_path / "e.jsonl", [event(lane="chat", pool="gpu", prompt_tokens=5)]))
    rows = _rows(path, parse_config(_config({"gpu_hour": 1.0})))
    assert [rows["chat"][c] for c in (*RATE_COLUMNS, COST_COLUMNS[0])] == [None] * 4


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 500), st.integers(0, 500)), min_size=2, max_size=12))
def test_rates_times_span_give_back_the_token_sums(pairs: list[tuple[int, int]]) -> None:
    """Prompt and generated tokens/s times the span are the log's token sums."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        events = [
            event(lane="chat", pool="gpu", ts=ts(60.0 * i), prompt_tokens=p, completion_tokens=g)
            for i, (p, g) in enumerate(pairs)
        ]
        rows = _rows(str(write_jsonl(Path(d) / "e.jsonl", events)), parse_config(_config()))
    span = 60.0 * (len(pairs) - 1)
    assert rows["chat"]["prompt_tokens_per_s"] * span == pytest.approx(
        sum(p for p, _ in pairs), abs=0.001 * span
    )
    assert rows["chat"]["generated_tokens_per_s"] * span == pytest.approx(
        sum(g for _, g in pairs), abs=0.001 * span
    )


@pytest.mark.process
def test_summary_cli_prints_the_columns(tmp_path: Path) -> None:
    """`vllm-obs query summary --config` with a price prints tokens/s and cost columns."""
    config = tmp_path / "lanes.yaml"
    config.write_text(yaml.safe_dump(_config({"gpu_hour": 2.0, "api_per_1k_tokens": 0.01})))
    cli = [sys.executable, "-m", "obs.cli", "query", "summary", _log(tmp_path)]
    out = subprocess.run(
        [*cli, "--config", str(config), "--format", "json"], capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    rows = {r["lane"]: r for r in json.loads(out.stdout)}
    assert rows["chat"]["generated_tokens_per_s"] == 2.0
    assert rows["batch"]["api_cost_per_1k_tokens"] == 0.01
    assert rows["batch"]["cost_per_1k_tokens"] > 0


def test_compare_shows_tokens_per_second_before_and_after(tmp_path: Path) -> None:
    """`compare` has a row per lane and token kind with each side's tokens/s (no test)."""
    from obs.query.api import compare

    config = tmp_path / "lanes.yaml"
    config.write_text(yaml.safe_dump(_config()))
    slow = [
        event(lane="chat", pool="gpu", ts=ts(10.0 * i), completion_tokens=10) for i in range(11)
    ]
    fast = [
        event(lane="chat", pool="gpu", ts=ts(10.0 * i), completion_tokens=30) for i in range(11)
    ]
    before = str(write_jsonl(tmp_path / "before.jsonl", slow))
    after = str(write_jsonl(tmp_path / "after.jsonl", fast))
    df = compare(before, after, config=str(config))
    row = df[(df["lane"] == "chat") & (df["metric"] == "generated_tokens_per_s")].iloc[0]
    assert (row["before"], row["after"]) == (1.1, 3.3)
    assert row["p_value"] != row["p_value"]  # NaN: rates are shown, not tested


def test_sweep_matrix_rows_carry_tokens_per_second(tmp_path: Path) -> None:
    """A profile's matrix row has the lane's prompt, generated and cached tokens/s."""
    from obs.sweep.matrix import ProfileData, lane_rows
    from obs.sweep.profile import resolve

    profile = resolve("single-balanced")
    lane = profile.config.lanes[0]
    events = [
        event(lane=lane.name, pool=lane.pool, ts=ts(10.0 * i), prompt_tokens=40,
              completion_tokens=10, cached_tokens=20)
        for i in range(11)
    ]  # fmt: skip
    path = str(write_jsonl(tmp_path / "e.jsonl", events))
    rows = lane_rows(ProfileData(profile, (path,), 100.0), Scan(path))
    assert [rows[0][c] for c in RATE_COLUMNS] == [4.4, 1.1, 2.2]
