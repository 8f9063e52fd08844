"""The `vllm-obs` entry point: building its parser costs no command's machinery."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = (
    "aiohttp", "fastapi", "uvicorn", "starlette", "pandas", "duckdb", "matplotlib",
    "grafanalib", "opentelemetry", "httpx", "numpy", "clickhouse_connect",
)  # fmt: skip


@pytest.mark.process
def test_building_every_commands_parser_imports_no_heavy_library() -> None:
    """`vllm-obs --help` (every subcommand's parser built) imports no web server, client,
    dataframe, plotting, tracing or dashboard library: each handler imports its own."""
    code = (
        "import sys; from obs.cli import build_parser; build_parser();"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.process
def test_the_probe_sees_a_heavy_import() -> None:
    """The same probe names a heavy library once something imports it (it can fail)."""
    code = (
        "import sys; from obs.cli import build_parser; build_parser(); import aiohttp;"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "aiohttp" in out.stdout


@pytest.mark.process
def test_a_command_builds_only_its_own_parser() -> None:
    """`vllm-obs query ...` imports the query command's module and no other command's (the
    engine command's parser alone took 0.6 s of a 600k-event summary's start)."""
    code = (
        "import sys; from obs.cli import build_parser; build_parser(['query', 'summary', 'x']);"
        "print(sorted(m for m in ('obs.engines.cli', 'obs.sweep.cli', 'obs.demo.cli', "
        "'obs.query.cli', 'obs.plan.cli') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['obs.query.cli']"


def test_each_command_name_is_the_one_its_module_registers() -> None:
    """obs.cli.COMMANDS maps every name to the module that adds exactly that subcommand, so a
    command found by name is the command `--help` lists."""
    import argparse
    import importlib

    from obs.cli import COMMANDS

    for name, module in COMMANDS.items():
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        importlib.import_module(module).add_parser(sub)
        assert list(sub.choices) == [name], module
