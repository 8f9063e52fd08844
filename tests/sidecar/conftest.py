"""Fixtures of the in-process suites (tests/sidecar/*/test_inproc_*.py): a scripted pool and
sidecars in the test process, one of each per module."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from obs.config import Config
from tests.support.inproc import InProcessSidecar
from tests.support.scripted_upstream import ScriptedUpstream

InprocFactory = Callable[..., InProcessSidecar]


@pytest.fixture(scope="module")
def scripted() -> Iterator[ScriptedUpstream]:
    """The module's scripted pool (each test scripts its own request ids)."""
    with ScriptedUpstream() as fake:
        yield fake


@pytest.fixture(scope="module")
def inproc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InprocFactory]:
    """Start in-process sidecars: ``inproc(config, **settings)``; all stopped after the module."""
    started: list[InProcessSidecar] = []

    def start(config: Config, **settings: Any) -> InProcessSidecar:
        events = tmp_path_factory.mktemp("inproc") / "events.jsonl"
        sc = InProcessSidecar(config, events, **settings)
        started.append(sc)
        return sc.start()

    yield start
    for sc in started:
        sc.stop()
