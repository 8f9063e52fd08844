"""Engine adapters: each engine's own ``/metrics`` mapped to the engine-neutral pool state.

A pool names its engine in the config (``engine: vllm | sglang | llamacpp | tgi | sim``)
or ``auto``, resolved from the metric-name prefix (``Adapter.prefix``) a replica's
``/metrics`` page carries. Pure: the edges (``obs.sidecar.pools.engine_scrape``) parse
the exposition and pass :class:`~obs.engines.metrics.Sums` in.
"""

from __future__ import annotations

from typing import Final

from obs.engines.adapters.base import Adapter
from obs.engines.adapters.llamacpp import LLAMACPP
from obs.engines.adapters.sglang import SGLANG
from obs.engines.adapters.sim import SIM
from obs.engines.adapters.tgi import TGI
from obs.engines.adapters.vllm import VLLM
from obs.engines.metrics import STATE_FIELDS, EngineState

ADAPTERS: Final = {a.name: a for a in (VLLM, SGLANG, LLAMACPP, TGI, SIM)}
ENGINES: Final = tuple(ADAPTERS)
AUTO: Final = "auto"
UNKNOWN: Final = "unknown"


def unknown_state() -> EngineState:
    """The state of a replica that answers but whose engine is not known: all absent."""
    return EngineState(UNKNOWN, None, None, None, None, None, None)


def reports(engine: str) -> frozenset[str]:
    """The state fields a pool of ``engine`` can report (``auto``: all of them)."""
    return ADAPTERS[engine].reports if engine in ADAPTERS else frozenset(STATE_FIELDS)


__all__ = ["ADAPTERS", "AUTO", "ENGINES", "UNKNOWN", "Adapter", "reports", "unknown_state"]
