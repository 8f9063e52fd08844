"""Fixtures of the in-process suites (tests/sidecar/*/test_inproc_*.py): a scripted pool and
sidecars in the test process, one of each per module."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from obs.config import Config
from obs.sidecar.serve import SWITCH_INTERVAL_S
from tests.support.inproc import InProcessSidecar
from tests.support.scripted_upstream import ScriptedUpstream

InprocFactory = Callable[..., InProcessSidecar]


@pytest.fixture(scope="module")
def scripted() -> Iterator[ScriptedUpstream]:
    """The module's scripted pool (each test scripts its own request ids)."""
    with ScriptedUpstream() as fake:
        yield fake


@pytest.fixture(scope="module")
def inproc() -> Iterator[InprocFactory]:
    """Start in-process sidecars: ``inproc(config, **settings)``; all stopped after the module.
    Their events are read from memory (``InProcessSidecar.event``): no events file. The
    GIL's switch interval is the one ``vllm-obs sidecar`` runs with (``serve``'s 0.5 ms, not
    CPython's 5 ms): the sidecar, its pool and the test are threads of one process here, and
    each hand-over between them would otherwise wait up to 5 ms."""
    started: list[InProcessSidecar] = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)

    def start(config: Config, **settings: Any) -> InProcessSidecar:
        sc = InProcessSidecar(config, **settings)
        started.append(sc)
        return sc.start()

    yield start
    for sc in started:
        sc.stop()
    sys.setswitchinterval(interval)
