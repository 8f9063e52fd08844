"""`vllm-obs query` at 3 a.m.: answers fit the terminal (120 columns when it is not one),
numbers read one way per column, tables that say nothing are left out, and a lane, pool,
model or tenant nothing knows is refused with the names that are known."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from obs.cli import main
from obs.query.table import Table, column_format, informative, render
from obs.query.terminal import DEFAULT_WIDTH, width, wrap

pytestmark = pytest.mark.inproc  # DuckDB's scan runs a thread

ROOT = Path(__file__).resolve().parents[2]
LOG = ROOT / "tests" / "data" / "demo-sim-events.jsonl"  # written by the real sidecar
CONFIG = ROOT / "obs" / "data" / "lanes.yaml"


def test_width_is_120_when_not_a_terminal() -> None:
    """A pipe or a file (no TTY) gets 120 columns."""
    assert width(io.StringIO()) == DEFAULT_WIDTH == 120


def test_one_number_format_per_column() -> None:
    """0.1, 2.1 and 0.235 in one column read 0.10, 2.10, 0.23; ratios are percentages with
    two decimals; whole numbers get separators only when one reaches 10,000."""
    fmt = column_format("ms", [0.1, 2.1, 0.235])
    assert [fmt(v) for v in (0.1, 2.1, 0.235)] == ["0.10", "2.10", "0.23"]
    big = column_format("e2e_ms", [594.3, 12861.2])
    assert [big(v) for v in (594.3, 12861.2)] == ["594", "12,861"]
    share = column_format("error_rate", [0.0125, 0.5])
    assert [share(v) for v in (0.0125, 0.5, None)] == ["1.25%", "50.00%", "-"]
    ints = column_format("requests", [3, 12])
    assert [ints(3), ints(12)] == ["3", "12"]


def test_a_wide_table_splits_into_blocks_that_fit() -> None:
    """A table wider than the width becomes blocks of columns, each within it and each led
    by the first column; every value is still shown; columns of zeros are named instead."""
    columns = ["request_id", *(f"metric_{i}_ms" for i in range(12)), "zero_rate"]
    rows = [(f"req-{r}", *(1000.0 * r + i for i in range(12)), 0.0) for r in range(3)]
    text = render(Table(columns, rows), width=80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert sum(line.startswith("request_id") for line in lines) >= 2
    for i in range(12):
        assert f"metric_{i}_ms" in text
    assert "zero_rate" in lines[-1] and "0 or - in every row" in lines[-1]
    narrow = render(Table(columns[:3], [r[:3] for r in rows]), width=80)
    assert narrow.splitlines()[0].split() == columns[:3]  # fits: unchanged


def test_tables_that_say_nothing() -> None:
    """No row, one value, or nothing but zeros: not informative; one non-zero: informative."""
    assert not informative(Table(["lane", "n"], []))
    assert not informative(Table(["lane", "n"], [("chat", 5)]))
    assert not informative(Table(["lane", "a", "b"], [("chat", 0, 0.0), ("rag", 0, 0.0)]))
    assert informative(Table(["lane", "a", "b"], [("chat", 0, 0.0), ("rag", 0, 2.0)]))


def test_wrap_keeps_bullets_under_their_text() -> None:
    """A long bullet wraps within the width, its continuation under its text."""
    text = "- " + " ".join(["word"] * 40)
    lines = wrap(text, 50).splitlines()
    assert len(lines) > 1 and all(len(line) <= 50 for line in lines)
    assert all(line.startswith("  word") for line in lines[1:])


@pytest.mark.parametrize(
    "command",
    [
        ["budget", "--config", str(CONFIG)],
        ["slowest"],
        ["timeline", "--config", str(CONFIG)],
        ["incident", "--config", str(CONFIG)],
        ["summary", "--config", str(CONFIG)],
    ],
)
def test_answers_fit_120_columns_on_a_real_log(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """On the sidecar's own event log, each answer's every line is at most 120 columns."""
    assert main(["query", *command, str(LOG), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.strip()
    assert max(len(line) for line in out.splitlines()) <= 120, out


def test_budget_leaves_out_rows_and_tables_of_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """budget lists SLOs without a miss on one line, not as rows of zeros, and no row of an
    unknown tenant."""
    assert main(["query", "budget", str(LOG), "--config", str(CONFIG), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "No misses: " in out and "long-prefill ttft" in out.split("No misses: ")[1]
    spent = out.split("Budget spent by phase")[0]
    assert " 0.00%" not in spent and "  0%" not in spent
    who = out.split("Behind the misses")[1].split("Worst misses")[0]
    assert " tenant " not in who  # the log has no tenant: nothing to say
    assert " replica " in who


@pytest.mark.parametrize(
    ("command", "flag", "value"),
    [
        (["incident"], "--lane", "chatt"),
        (["budget"], "--pool", "interactiv"),
        (["slowest"], "--model", "tinyy"),
        (["timeline"], "--tenant", "acme"),
        (["summary"], "--lane", "chat,chatt"),
        (["show", "demo-9ef4b8-000005"], "--lane", "chatt"),
        (["canary"], "--lane", "chatt"),
    ],
)
def test_an_unknown_name_exits_2_with_the_known_ones(
    command: list[str], flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A lane, pool, model or tenant neither the log nor the config knows: exit 2, naming
    the unknown one and the known ones (never "no lane missed an SLO")."""
    code = main(["query", *command, str(LOG), flag, value, "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    dim = flag.removeprefix("--")
    assert f"unknown {dim} " in err and repr(value.split(",")[-1]) in err
    if dim == "lane" and command[0] in ("incident", "summary", "canary"):  # with --config
        assert "agent, batch, chat, long-prefill, rag, slow-stream" in err
    elif dim == "lane":  # a command without --config: the log's own lanes
        assert "know agent, chat, long-prefill, rag\n" in err
    if dim == "pool":
        assert "bulk, interactive" in err


def test_a_name_only_the_config_knows_is_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    """batch is in the config but served no request in this log: a real answer, exit 0."""
    args = [str(LOG), "--config", str(CONFIG), "--lane", "batch", "--no-progress"]
    assert main(["query", "timeline", *args]) == 0
    assert main(["query", "budget", *args]) == 0
    assert "unknown lane" not in capsys.readouterr().err
