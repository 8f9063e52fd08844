"""What an engine adapter is: a name, how to recognise the engine, and a state mapping."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from obs.engines.metrics import EngineState, Sums
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
    read: Callable[[Sums], EngineState]
    """The mapping; a value the engine never reports it leaves ``None`` whatever the page."""
    wants: tuple[str, ...]
    """The sample names ``read`` uses: the rest of the page need not be parsed."""
    serve_flags: str
    """What the engine must be started with for the values the sidecar reads."""
    events: Mapping[str, str]
    """Event fields (obs.events) this engine fills differently, and how; the rest as vLLM."""
    tested: str
    """What the adapter is tested against: a real server here, or captures of its source."""
    reports: frozenset[str] = field(init=False)
    """The :data:`~obs.engines.metrics.STATE_FIELDS` this engine can report at all: what
    ``read`` gives from a page carrying every sample it wants (``read`` is the one source)."""

    def __post_init__(self) -> None:
        full = Sums({name: (1.0, 1) for name in self.wants})
        object.__setattr__(self, "reports", self.read(full).reported())
        strange = set(self.events) - EVENT_FIELDS
        if strange:
            raise ValueError(f"adapter {self.name}: unknown event fields {sorted(strange)}")

    def state(self, sums: Sums) -> EngineState:
        """The replica's state (``read`` of its samples)."""
        return self.read(sums)
