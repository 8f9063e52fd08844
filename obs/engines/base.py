"""What an engine adapter is: a name, how to recognise the engine, and a state mapping."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from obs.engine_metrics import STATE_FIELDS, EngineState, Sums
from obs.events import Event

EVENT_FIELDS = frozenset(Event.__dataclass_fields__)
# The event fields that come from the engine's own view (its spans), not from the relay.
ENGINE_VIEW_FIELDS = (
    "engine_queue_ms",
    "engine_prefill_ms",
    "engine_decode_ms",
    "engine_inference_ms",
    "engine_ttft_ms",
)


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
    events: Mapping[str, str]
    """Event fields (obs.events) this engine fills differently, and how; the rest as vLLM."""
    tested: str
    """What the adapter is tested against: a real server here, or captures of its source."""

    def __post_init__(self) -> None:
        unknown = self.reports - set(STATE_FIELDS)
        if unknown:
            raise ValueError(f"adapter {self.name}: unknown state fields {sorted(unknown)}")
        strange = set(self.events) - EVENT_FIELDS
        if strange:
            raise ValueError(f"adapter {self.name}: unknown event fields {sorted(strange)}")

    def state(self, sums: Sums) -> EngineState:
        """The replica's state; a field outside ``reports`` is always absent."""
        state = self.read(sums)
        extra = state.reported() - self.reports
        if not extra:
            return state
        cleared: dict[str, Any] = dict.fromkeys(extra)
        return replace(state, **cleared)
