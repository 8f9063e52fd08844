"""Two pytest-xdist workers, each with its own session engines: which tests go together.

``scripts/check`` runs the suite with ``-n 2 --dist loadscope``: a work unit (a scope) goes to
one worker whole, and each worker starts the session fixtures its tests ask for (engines, a
ClickHouse, a Redis; ports from ``obs.procs.free_port``, files under its own ``tmp_path``).
A module is a scope, except that the tests sharing a costly session resource other than the
main engine are one scope, so that one worker starts it (``SHARED``: the first of these
fixtures a test uses names its scope), and a test that ends the main engine is a scope of its
own (run after the larger ones: its worker starts that engine again if it needs it later).

The worker knows a test's fixtures; the controller, which schedules, knows only its node id:
the first worker writes each test's scope and tier to a file the controller names
(``SCOPES_ENV``) before it reports its collection, and the controller's scheduler reads it.

Which unit a free worker takes next: the costliest left (longest first, so that no long unit
starts last while the other worker idles), with the ``ends:`` units after all others. A unit's
cost is its seconds in ``scope_costs.tsv`` beside this module (a whole run's measure: run the
suite with ``VLLM_OBS_SCOPE_COSTS=FILE`` set and then ``python -m tests.support.workers FILE``),
else an estimate from its tests' tiers (``TIER_S``). Only the order depends on it: a stale file
costs time, never a result.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

SCOPES_ENV = "VLLM_OBS_XDIST_SCOPES"
COSTS_ENV = "VLLM_OBS_SCOPE_COSTS"  # set: each worker appends its units' seconds there
COSTS = Path(__file__).with_name("scope_costs.tsv")
# A unit missing from COSTS: its tests' seconds by tier (the suite's means, roughly).
TIER_S = {"unit": 0.02, "inproc": 0.1, "process": 2.0, "stack": 6.0, "engine": 6.0}
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


def _tier(item: pytest.Item) -> str:
    return next((t for t in TIER_S if item.get_closest_marker(t) is not None), "process")


def record(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On the first worker: each collected test's scope and tier, for the controller."""
    path = os.environ.get(SCOPES_ENV)
    worker = getattr(config, "workerinput", {}).get("workerid")
    if path and worker == "gw0":
        lines = (f"{item.nodeid}\t{scope_of(item)}\t{_tier(item)}\n" for item in items)
        Path(path).write_text("".join(lines), encoding="utf-8")


def measure(item: pytest.Item, seconds: float) -> None:
    """With ``COSTS_ENV`` set: add one phase's seconds (setup, call or teardown) of ``item``
    to the file it names, by scope."""
    path = os.environ.get(COSTS_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(f"{scope_of(item)}\t{seconds:.3f}\n")


def read_costs(path: Path) -> dict[str, float]:
    """Seconds by scope in a file of ``scope<TAB>seconds`` lines (summed when repeated)."""
    out: dict[str, float] = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            scope, _, secs = line.rpartition("\t")
            if scope and not line.startswith("#"):
                out[scope] = out.get(scope, 0.0) + float(secs)
    return out


class CostliestFirst(OrderedDict[str, dict[str, bool]]):
    """xdist's work queue, which takes the next unit with ``popitem(last=False)``: the costliest
    left instead of the first in, ``ends:`` units last."""

    def __init__(self, cost: dict[str, float]) -> None:
        super().__init__()
        self._cost = cost

    def _key(self, scope: str) -> tuple[bool, float]:
        if scope.startswith("ends:"):
            return (False, 0.0)  # after all others, in their own order (tests/conftest.py)
        return (True, self._cost.get(scope, 0.0))

    def popitem(self, last: bool = True) -> tuple[str, dict[str, bool]]:
        if last:
            return super().popitem(last=True)
        scope = max(self, key=self._key)  # the first of equals: xdist's own order
        return scope, self.pop(scope)


class SharedResourceScheduling(LoadScopeScheduling):
    """``--dist loadscope`` with the scopes the workers wrote (a test missing there, as in a
    run whose workers did not write them: its module)."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self._scopes: dict[str, str] | None = None
        self._measured = read_costs(COSTS)
        self._estimate: dict[str, float] = {}
        self.workqueue = CostliestFirst(self._estimate)

    def _split_scope(self, nodeid: str) -> str:
        if self._scopes is None:
            path = os.environ.get(SCOPES_ENV)
            text = Path(path).read_text(encoding="utf-8") if path else ""
            self._scopes = {}
            for line in text.splitlines():
                node, scope, tier = [*line.split("\t"), "", ""][:3]
                if scope:
                    self._scopes[node] = scope
                    estimate = self._estimate.get(scope, 0.0) + TIER_S.get(tier, 0.0)
                    self._estimate[scope] = estimate
            for scope, secs in self._measured.items():
                if scope in self._estimate:
                    self._estimate[scope] = secs
        return self._scopes.get(nodeid) or super()._split_scope(nodeid)


def make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    """The scheduler of ``--dist loadscope`` (None: xdist's own for any other mode)."""
    if config.getoption("dist") == "loadscope":
        return SharedResourceScheduling(config, log)
    return None


def main(argv: list[str]) -> int:
    """``python -m tests.support.workers FILE``: write ``scope_costs.tsv`` from the seconds a
    run with ``VLLM_OBS_SCOPE_COSTS=FILE`` measured."""
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python -m tests.support.workers MEASURED_FILE", file=sys.stderr)
        return 2
    measured = read_costs(Path(argv[0]))
    if not measured:
        print(f"{argv[0]}: no measured scopes", file=sys.stderr)
        return 1
    head = "# seconds by xdist unit, from one whole run (tests/support/workers.py)\n"
    rows = sorted(measured.items(), key=lambda kv: -kv[1])
    COSTS.write_text(head + "".join(f"{k}\t{v:.0f}\n" for k, v in rows), encoding="utf-8")
    print(f"{COSTS}: {len(rows)} units, {sum(measured.values()):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
