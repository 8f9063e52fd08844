"""What an engine adapter is: a name, how to recognise the engine, and a state mapping."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from obs.engine_metrics import STATE_FIELDS, EngineState, Sums


@dataclass(frozen=True, slots=True)
class Adapter:
    """Maps one engine's ``/metrics`` samples to the engine-neutral :class:`EngineState`."""

    name: str
    prefix: str
    """Every metric the engine exports starts with this (how ``engine: auto`` detects it)."""
    reports: frozenset[str]
    """The :data:`~obs.engine_metrics.STATE_FIELDS` this engine can report at all."""
    read: Callable[[Sums], EngineState]
    wants: tuple[str, ...]
    """The sample names ``read`` uses: the rest of the page need not be parsed."""
    serve_flags: str
    """What the engine must be started with for the values the sidecar reads."""

    def __post_init__(self) -> None:
        unknown = self.reports - set(STATE_FIELDS)
        if unknown:
            raise ValueError(f"adapter {self.name}: unknown state fields {sorted(unknown)}")

    def state(self, sums: Sums) -> EngineState:
        """The replica's state; a field outside ``reports`` is always absent."""
        return self.read(sums)
