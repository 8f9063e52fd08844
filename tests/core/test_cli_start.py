"""The `vllm-obs` entry point: building its parser costs no command's machinery."""

from __future__ import annotations

import subprocess
import sys

HEAVY = (
    "aiohttp", "fastapi", "uvicorn", "starlette", "pandas", "duckdb", "matplotlib",
    "grafanalib", "opentelemetry", "httpx", "numpy", "clickhouse_connect",
)  # fmt: skip


def test_building_every_commands_parser_imports_no_heavy_library() -> None:
    """`vllm-obs --help` (every subcommand's parser built) imports no web server, client,
    dataframe, plotting, tracing or dashboard library: each handler imports its own."""
    code = (
        "import sys; from obs.cli import build_parser; build_parser();"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_probe_sees_a_heavy_import() -> None:
    """The same probe names a heavy library once something imports it (it can fail)."""
    code = (
        "import sys; from obs.cli import build_parser; build_parser(); import aiohttp;"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "aiohttp" in out.stdout
