"""The suite's tiers: each test has exactly one, named for what it runs (docs/testing.md).

``unit``    pure code: no socket bound or connected, no thread, no subprocess (enforced here)
``inproc``  the sidecar (or another server) in this process: sockets and threads, no subprocess
            (enforced here)
``process`` starts a subprocess: a sidecar process, a simulated pool, the CLI
``stack``   Prometheus, promtool, Alertmanager, ClickHouse, Redis
``engine``  a real engine: vLLM, llama.cpp (with a stack part or not)

A test's tier is, in this order: its tier mark (the closest of the test's own, its class's and
its module's ``pytestmark = pytest.mark.process``), or the heaviest tier of the shared fixtures
it uses (``FIXTURE_TIERS``), or ``unit``. A test with two tier marks on one node, or a mark
lighter than a fixture it uses, fails at collection. A ``unit`` or ``inproc`` test that does
what its tier forbids fails with a message naming the call: mark it with the tier it needs.

The guard patches the standard library's entry points (``socket.socket.bind``/``connect``,
``threading.Thread.start``, ``subprocess.Popen``, ``os.fork``/``posix_spawn``) while a test's
setup and call run; nothing of the project's own code is patched.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

TIERS = ("unit", "inproc", "process", "stack", "engine")  # lightest first
FAST = ("unit", "inproc")  # scripts/check --fast

# The shared fixtures (tests/conftest.py) that decide a test's tier: the heaviest one used wins.
FIXTURE_TIERS = {
    # a real engine
    "engine_paths": "engine",
    "llamacpp_paths": "engine",
    "llama": "engine",
    "session_engines": "engine",
    "vllm": "engine",
    "vllm_b": "engine",
    "spare_engine": "engine",
    "traced_engine": "engine",
    "two_slot_engine": "engine",
    # a database, a rule checker, a scraper
    "clickhouse": "stack",
    "redis_server": "stack",
    # a subprocess
    "sidecar": "process",
    # a server thread of this process (tests/sidecar/conftest.py: the sidecar and its pool)
    "otlp_receiver": "inproc",
    "inproc": "inproc",
    "scripted": "inproc",
}
# Where the shared fixtures are defined.
SHARED_FIXTURE_MODULES = frozenset({"tests.conftest", "tests.sidecar.conftest"})
_RANK = {tier: i for i, tier in enumerate(TIERS)}

# What each light tier may not do (the guard's names for it).
_FORBIDDEN = {
    "unit": frozenset({"socket", "thread", "subprocess"}),
    "inproc": frozenset({"subprocess"}),
}


class TierError(Exception):
    """A test's tier does not fit what it does."""


def tier_marks(item: pytest.Item) -> list[str]:
    """The tier marks of the closest node of ``item``'s chain that has any (the test, then its
    class, then its module): a test's own mark overrides its module's."""
    for node in reversed(item.listchain()):
        marks = {m.name for m in node.own_markers if m.name in _RANK}
        if marks:
            return sorted(marks, key=_RANK.__getitem__)
    return []


def fixture_tier(item: pytest.Item) -> tuple[str, str | None]:
    """The heaviest tier the shared fixtures of ``item`` imply, and the fixture that implies it
    (a module's own fixture of the same name is not the shared one: it implies nothing)."""
    tier, why = "unit", None
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs if info is not None else {}
    for name in getattr(item, "fixturenames", ()):
        implied = FIXTURE_TIERS.get(name)
        chosen = defs.get(name)
        if implied is None or not chosen:
            continue
        if getattr(chosen[-1].func, "__module__", "") not in SHARED_FIXTURE_MODULES:
            continue
        if _RANK[implied] > _RANK[tier]:
            tier, why = implied, name
    return tier, why


def assign(item: pytest.Item) -> str:
    """``item``'s tier (added to it as a mark), or TierError."""
    marks = tier_marks(item)
    if len(marks) > 1:
        raise TierError(f"two tiers: {' and '.join(marks)} (a test has exactly one)")
    implied, fixture = fixture_tier(item)
    if not marks:
        item.add_marker(implied)
        return implied
    (tier,) = marks
    if _RANK[tier] < _RANK[implied]:
        raise TierError(f"marked {tier}, but its fixture {fixture!r} is {implied}: two tiers")
    return tier


def tier_of(item: pytest.Item) -> str:
    """The tier ``assign`` gave ``item``."""
    (tier,) = tier_marks(item)
    return tier


class _Guard:
    """While ``forbid`` is set, the standard library's ways to open a socket, start a thread or
    a process raise ``TierError`` (or, with ``audit``, are written to that file and allowed)."""

    def __init__(self) -> None:
        self.forbid: frozenset[str] = frozenset()
        self.tier = ""
        self.nodeid = ""
        self.audit = os.environ.get("VLLM_OBS_TIER_AUDIT")
        self.owner = threading.get_ident()  # the test's thread: other threads are not judged

    def check(self, what: str, detail: str) -> None:
        if what not in self.forbid or threading.get_ident() != self.owner:
            return
        if self.audit:
            with open(self.audit, "a", encoding="utf-8") as out:
                out.write(f"{self.nodeid}\t{self.tier}\t{what}\t{detail}\n")
            return
        needs = "process" if what == "subprocess" else "inproc"
        raise TierError(
            f"a {self.tier}-tier test may not {detail} ({what}): mark it with the tier it "
            f"needs, e.g. pytestmark = pytest.mark.{needs} (docs/testing.md)"
        )

    @contextmanager
    def judging(self, item: pytest.Item) -> Iterator[None]:
        self.forbid = _FORBIDDEN.get(tier_of(item), frozenset())
        self.tier, self.nodeid = tier_of(item), item.nodeid
        try:
            yield
        finally:
            self.forbid = frozenset()


GUARD = _Guard()


def _wrap(owner: Any, name: str, what: str, detail: str) -> None:
    original: Callable[..., Any] = getattr(owner, name)

    def guarded(*args: Any, **kwargs: Any) -> Any:
        GUARD.check(what, detail)
        return original(*args, **kwargs)

    guarded.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(owner, name, guarded)


def install() -> None:
    """Put the guard on the standard library's entry points (once, for the whole session)."""
    if getattr(socket.socket.bind, "__wrapped__", None) is not None:
        return
    _wrap(socket.socket, "bind", "socket", "bind a socket")
    _wrap(socket.socket, "connect", "socket", "connect a socket")
    _wrap(socket.socket, "connect_ex", "socket", "connect a socket")
    _wrap(threading.Thread, "start", "thread", "start a thread")
    _wrap(subprocess.Popen, "__init__", "subprocess", "start a subprocess")
    _wrap(os, "fork", "subprocess", "fork")
    _wrap(os, "posix_spawn", "subprocess", "spawn a process")


def collect(items: list[pytest.Item]) -> None:
    """Give each collected test its tier; a test that has none or two fails here."""
    errors = []
    for item in items:
        try:
            assign(item)
        except TierError as err:
            errors.append(f"{item.nodeid}: {err}")
    if errors:
        raise pytest.UsageError("tests without exactly one tier:\n" + "\n".join(errors))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    with GUARD.judging(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    with GUARD.judging(item):
        return (yield)
