"""The house rules the code keeps (docs/architecture.md): small modules, short functions.

A module over 400 lines or a function over 80 lines does more than one thing; the exception
is a flat declaration (an argparse parser, a table of panels or cases), which reads top to
bottom however long it is: a function with at most one branch counts as flat.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("obs", "sidecar", "exporters", "dashboards", "alerts", "loadgen", "clickhouse")
FOLDERS = (*PACKAGES, "bench", "scripts", "tests")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
LOOPS: tuple[type[ast.AST], ...] = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.DictComp)
BRANCHES = (*LOOPS, ast.SetComp, ast.GeneratorExp, ast.If, ast.IfExp, ast.Match, ast.Try, ast.With)


def _sources() -> list[Path]:
    return sorted(p for f in FOLDERS for p in (ROOT / f).rglob("*.py") if "build" not in p.parts)


def _long_functions(path: Path, root: Path = ROOT) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        lines = (node.end_lineno or node.lineno) - node.lineno + 1
        branches = sum(isinstance(n, BRANCHES) for n in ast.walk(node))
        if lines > MAX_FUNCTION_LINES and branches > 1:
            found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_module_is_over_400_lines() -> None:
    """Every Python module of the project, tests and benchmarks included, has at most 400 lines."""
    long = []
    for path in _sources():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MAX_MODULE_LINES:
            long.append(f"{path.relative_to(ROOT)} ({n} lines)")
    assert not long, "split these modules: " + ", ".join(long)


def test_no_function_is_over_80_lines_unless_flat() -> None:
    """Every function over 80 lines is a flat declaration (at most one branch)."""
    long = [f for path in _sources() for f in _long_functions(path)]
    assert not long, "split these functions: " + ", ".join(long)


@pytest.mark.parametrize("source", ["def f():\n" + "    x = 1\n" * 90, "def f():\n    pass\n"])
def test_a_flat_function_passes_whatever_its_length(tmp_path: Path, source: str) -> None:
    """A long function without branches is a declaration: the rule lets it be."""
    path = tmp_path / "flat.py"
    path.write_text(source, encoding="utf-8")
    assert _long_functions(path, tmp_path) == []


def test_a_long_branching_function_is_named(tmp_path: Path) -> None:
    """A function over 80 lines with loops and ifs is reported with its place and length."""
    body = "    for i in range(3):\n        if i:\n            pass\n" + "    x = 1\n" * 80
    path = tmp_path / "busy.py"
    path.write_text("def busy():\n" + body, encoding="utf-8")
    assert _long_functions(path, tmp_path) == ["busy.py:1 busy (84 lines)"]


OUTSIDE_PREFIXES = ("/work/", "../shared", "shared/reference")


def _paths_outside(path: Path, root: Path = ROOT) -> list[str]:
    """Places that name a file outside the checkout: ``Path / ".."`` or a known outside prefix."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        up = (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Div)
            and isinstance(node.right, ast.Constant)
            and node.right.value == ".."
        )
        outside = isinstance(node, ast.Constant) and (
            isinstance(node.value, str) and node.value.startswith(OUTSIDE_PREFIXES)
        )
        if up or outside:
            found.append(f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}")
    return found


def test_nothing_reads_a_path_outside_the_checkout() -> None:
    """The package, tests and benchmarks read only files inside the repository (a clone has no
    ../shared): a fixture they need is copied into tests/data."""
    outside = [
        f for path in _sources() if path.name != "test_house.py" for f in _paths_outside(path)
    ]
    assert not outside, "copy what these read into the repository: " + ", ".join(outside)


@pytest.mark.parametrize(
    ("source", "line"),
    [
        (
            'from pathlib import Path\nP = Path(__file__).parents[2] / ".." / "shared" / "x.txt"\n',
            2,
        ),
        ('P = "/work/shared/reference/vllm-0.32-cpu-metrics.txt"\n', 1),
    ],
)
def test_a_path_outside_the_checkout_is_named(tmp_path: Path, source: str, line: int) -> None:
    """Both ways the suite once read ../shared (a climb out of the tree, a fixed path) fail."""
    path = tmp_path / "reads_outside.py"
    path.write_text(source, encoding="utf-8")
    assert _paths_outside(path, tmp_path) == [f"reads_outside.py:{line}"]


def _test_imports(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line`` of each import of the ``tests`` package in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        if any(n == "tests" or n.startswith("tests.") for n in names):
            found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_the_package_and_the_benchmarks_import_no_test_code() -> None:
    """Test-only code stays under tests/: the package and bench/ never import it."""
    found = [
        f
        for path in _sources()
        if path.relative_to(ROOT).parts[0] not in ("tests", "scripts")
        for f in _test_imports(path)
    ]
    assert not found, "move what these need out of tests/: " + ", ".join(found)


def test_an_import_of_test_code_is_named(tmp_path: Path) -> None:
    """Both import forms of the tests package are found; a module named like it is not."""
    path = tmp_path / "bench_like.py"
    path.write_text(
        "import testsuite\nfrom tests.support.probes import metric\nimport tests.conftest\n",
        encoding="utf-8",
    )
    assert _test_imports(path, tmp_path) == ["bench_like.py:2", "bench_like.py:3"]
