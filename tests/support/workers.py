"""Two pytest-xdist workers, each with its own session engines: which tests go together.

``scripts/check`` runs the suite with ``-n 2 --dist loadscope``: a work unit (a scope) goes to
one worker whole, and each worker starts the session fixtures its tests ask for (engines, a
ClickHouse, a Redis; ports from ``obs.procs.free_port``, files under its own ``tmp_path``).
A module is a scope, except that the tests sharing a costly session resource other than the
main engine are one scope, so that one worker starts it (``SHARED``: the first of these
fixtures a test uses names its scope), and a test that ends the main engine is a scope of its
own (run after the larger ones: its worker starts that engine again if it needs it later).

The worker knows a test's fixtures; the controller, which schedules, knows only its node id:
the first worker writes each test's scope to a file the controller names (``SCOPES_ENV``)
before it reports its collection, and the controller's scheduler reads it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

SCOPES_ENV = "VLLM_OBS_XDIST_SCOPES"
# The session resources whose tests go to one worker, in order of precedence.
SHARED = (
    "traced_engine",
    "two_slot_engine",
    "spare_engine",
    "vllm_b",
    "llama",
    "clickhouse",
    "redis_server",
)


def scope_of(item: pytest.Item) -> str:
    """The work unit ``item`` belongs to (see the module's doc)."""
    names = set(getattr(item, "fixturenames", ()))
    for fixture in SHARED:
        if fixture in names:
            return f"shared:{fixture}"
    ending = item.get_closest_marker("ends_engine")
    if ending is not None:
        return f"ends:{','.join(ending.args)}"
    return item.nodeid.split("::", 1)[0]


def configure(config: pytest.Config) -> None:
    """On the controller of an xdist run: a file for the workers' scopes (they inherit the
    variable when they start, after this)."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    fd, path = tempfile.mkstemp(prefix="vllm-obs-scopes-", suffix=".tsv")
    os.close(fd)
    os.environ[SCOPES_ENV] = path


def unconfigure(config: pytest.Config) -> None:
    """The controller removes its scopes file."""
    path = os.environ.get(SCOPES_ENV)
    if path and not hasattr(config, "workerinput"):
        Path(path).unlink(missing_ok=True)


def record(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On the first worker: each collected test's scope, for the controller."""
    path = os.environ.get(SCOPES_ENV)
    worker = getattr(config, "workerinput", {}).get("workerid")
    if path and worker == "gw0":
        lines = (f"{item.nodeid}\t{scope_of(item)}\n" for item in items)
        Path(path).write_text("".join(lines), encoding="utf-8")


class SharedResourceScheduling(LoadScopeScheduling):
    """``--dist loadscope`` with the scopes the workers wrote (a test missing there, as in a
    run whose workers did not write them: its module)."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self._scopes: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._scopes is None:
            path = os.environ.get(SCOPES_ENV)
            text = Path(path).read_text(encoding="utf-8") if path else ""
            self._scopes = dict(line.split("\t", 1) for line in text.splitlines() if "\t" in line)
        return self._scopes.get(nodeid) or super()._split_scope(nodeid)


def make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    """The scheduler of ``--dist loadscope`` (None: xdist's own for any other mode)."""
    if config.getoption("dist") == "loadscope":
        return SharedResourceScheduling(config, log)
    return None
