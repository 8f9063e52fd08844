"""The import tree the checkers need: ``obs.sidecar``, ``obs.exporters``, ... as Python sees them.

The top-level folders (sidecar/, exporters/, ...) install as ``obs.*`` through setuptools'
``package-dir`` (pyproject.toml). Static tools (mypy, import-linter) cannot follow that
mapping: run on the source tree, they would see ``sidecar.relay.relay`` where the code imports
``obs.sidecar.relay.relay``, and check nothing across packages. ``build()`` makes the tree they
need under ``build/typecheck`` from the same ``package-dir`` table (hard links: no copy,
edits show at once), with tests/ and bench/ beside it. Used by ``scripts/typecheck`` and
``scripts/layers``.
"""

from __future__ import annotations

import os
import shutil
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"
EXTRA = ("tests", "bench")  # checked as they are, beside the package


def package_dirs() -> dict[str, str]:
    """Folder of each mapped package, from pyproject's ``[tool.setuptools] package-dir``."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return dict(data["tool"]["setuptools"]["package-dir"])


def link_tree(src: Path, dst: Path) -> None:
    """Hard-link every .py/.pyi/py.typed file of ``src`` under ``dst`` (folders as they are)."""
    for path in src.rglob("*"):
        if path.suffix not in (".py", ".pyi") and path.name != "py.typed":
            continue
        if "__pycache__" in path.parts:
            continue
        target = dst / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(path, target)


def build() -> dict[str, str]:
    """The import tree; returns tree path prefix -> repository path prefix."""
    if TREE.exists():
        shutil.rmtree(TREE)
    back: dict[str, str] = {}
    mapping = package_dirs()
    # Deepest packages first, so a mapped folder is never also linked inside its parent.
    for package, folder in sorted(mapping.items(), key=lambda kv: -kv[0].count(".")):
        dst = TREE / package.replace(".", "/")
        if package == "obs":
            link_tree_skipping(
                ROOT / folder, dst, {p.split(".", 1)[1] for p in mapping if "." in p}
            )
        else:
            link_tree(ROOT / folder, dst)
        back[package.replace(".", "/") + "/"] = folder + "/"
    for extra in EXTRA:
        link_tree(ROOT / extra, TREE / extra)
        back[extra + "/"] = extra + "/"
    return back


def link_tree_skipping(src: Path, dst: Path, skip: set[str]) -> None:
    for child in src.iterdir():
        if child.name in skip or child.name == "__pycache__":
            continue
        if child.is_dir():
            link_tree(child, dst / child.name)
        elif child.suffix in (".py", ".pyi") or child.name == "py.typed":
            dst.mkdir(parents=True, exist_ok=True)
            os.link(child, dst / child.name)
