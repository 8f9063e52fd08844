"""``vllm-obs query ...`` from the command line: formats, warnings, errors, lean start."""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from obs.cli import main
from obs.query import cli as query_cli
from obs.query.testing import mixed_events, write_jsonl

pytestmark = pytest.mark.inproc


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Parse with the query subcommand alone and run the handler."""
    parser = argparse.ArgumentParser(prog="vllm-obs")
    query_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["query", *argv])
    rc = args.handler(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_summary_json_has_one_record_per_lane(mixed_log_path, capsys):
    """--format json prints the per-lane records with raw numbers."""
    rc, out, _ = run(["summary", mixed_log_path, "--format", "json"], capsys)
    assert rc == 0
    rows = json.loads(out)
    assert [r["lane"] for r in rows] == ["rag", "batch", "chat", "canary"]
    assert rows[0]["requests"] == 7 and rows[0]["error_rate"] == pytest.approx(1 / 7, abs=1e-6)


def test_summary_table_and_markdown_put_lanes_in_columns(mixed_log_path, capsys):
    """Table and markdown output are transposed: one column per lane, one row per metric."""
    _, table, _ = run(["summary", mixed_log_path], capsys)
    header = table.splitlines()[0].split()
    assert header == ["lane", "rag", "batch", "chat", "canary"]
    assert any(line.startswith("goodput_ratio") for line in table.splitlines())
    _, md, _ = run(["summary", mixed_log_path, "--format", "markdown"], capsys)
    assert md.splitlines()[0] == "| lane | rag | batch | chat | canary |"
    assert md.splitlines()[1].startswith("| --- |")


def test_csv_output_parses_back(mixed_log_path, capsys):
    """--format csv is a header plus one row per result row."""
    _, out, _ = run(
        ["slowest", mixed_log_path, "--by", "ttft", "-n", "3", "--format", "csv"], capsys
    )
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 3
    assert float(rows[0]["ttft_ms"]) >= float(rows[1]["ttft_ms"]) >= float(rows[2]["ttft_ms"])


def test_filters_apply_on_the_command_line(mixed_log_path, capsys):
    """--lane and --status narrow the events every command sees."""
    _, out, _ = run(
        [
            "slowest",
            mixed_log_path,
            "--lane",
            "chat",
            "--status",
            "error,rejected",
            "--format",
            "json",
        ],
        capsys,
    )
    rows = json.loads(out)
    assert {(r["lane"], r["status"]) for r in rows} == {("chat", "error"), ("chat", "rejected")}


def test_show_prints_fields_and_waterfall_or_json(mixed_log_path, capsys):
    """show prints the event and its waterfall; --format json gives event and phase spans."""
    _, out, _ = run(["show", "req-0003", mixed_log_path], capsys)
    assert "request_id" in out and "req-0003" in out and "decode" in out
    _, out, _ = run(["show", "req-0003", mixed_log_path, "--format", "json"], capsys)
    doc = json.loads(out)
    assert doc["event"]["request_id"] == "req-0003"
    assert [p["phase"] for p in doc["phases"]] == [
        "queue",
        "prefill",
        "first_token",
        "decode",
        "stream",
    ]


def test_timeline_and_compare_run(mixed_log_path, capsys):
    """timeline and compare (one log, two windows) print their tables."""
    _, out, _ = run(["timeline", mixed_log_path, "--interval", "2m", "--format", "json"], capsys)
    assert sum(r["requests"] for r in json.loads(out)) == 28
    _, out, _ = run(
        [
            "compare",
            mixed_log_path,
            "--before",
            "2025-06-02T12:00..2025-06-02T12:04",
            "--after",
            "2025-06-02T12:04..",
            "--format",
            "json",
        ],
        capsys,
    )
    rows = json.loads(out)
    assert {r["test"] for r in rows} >= {"two-proportion z", "mann-whitney", None}


def test_malformed_lines_warn_on_stderr(tmp_path: Path, capsys):
    """Skipped lines are reported on stderr and the command still succeeds."""
    path = write_jsonl(
        tmp_path / "e.jsonl", mixed_events(), extra_lines=[b"oops"], truncated_tail=b'{"a'
    )
    rc, out, err = run(["summary", str(path), "--format", "csv"], capsys)
    assert rc == 0 and out
    assert "skipped 1 malformed line" in err and "truncated last line" in err


def test_bad_arguments_exit_2_with_a_message(mixed_log_path, capsys):
    """An unknown status or a missing file is a one-line error and exit status 2."""
    assert main(["query", "summary", mixed_log_path, "--status", "done"]) == 2
    assert "unknown status 'done'" in capsys.readouterr().err
    assert main(["query", "summary", mixed_log_path + ".missing"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["query", "compare", mixed_log_path]) == 2
    assert "--before" in capsys.readouterr().err


def test_report_and_export_commands_write_files(mixed_log_path, tmp_path: Path, capsys):
    """report writes report.html and PNGs; export writes a Parquet dataset."""
    rc, _, err = run(["report", mixed_log_path, "--out", str(tmp_path / "rep")], capsys)
    assert rc == 0 and "report.html" in err
    assert (tmp_path / "rep" / "report.html").exists()
    rc, out, _ = run(["export", mixed_log_path, "--out", str(tmp_path / "ds")], capsys)
    assert rc == 0 and "wrote 28 events" in out
    _, out, _ = run(["summary", str(tmp_path / "ds"), "--format", "json"], capsys)
    assert sum(r["requests"] for r in json.loads(out)) == 28


@pytest.mark.process
def test_cli_start_does_not_import_heavy_libraries():
    """Building the CLI parser imports neither DuckDB, pandas nor matplotlib."""
    code = (
        "import sys; from obs.query import cli; import argparse;"
        "p = argparse.ArgumentParser(); cli.add_parser(p.add_subparsers());"
        "heavy = ('duckdb', 'pandas', 'matplotlib', 'pydantic');"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.process
def test_summary_path_does_not_import_pandas_or_matplotlib(mixed_log_path):
    """The summary command runs without pandas or matplotlib (cold-start cost)."""
    code = (
        "import sys; from obs.cli import main;"
        f"main(['query', 'summary', {mixed_log_path!r}, '--format', 'csv']);"
        "print(sorted(m for m in ('pandas', 'matplotlib') if m in sys.modules), file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr.strip().splitlines()[-1] == "[]"
