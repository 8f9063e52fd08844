"""What ``vllm-obs demo`` was asked to do, and the local pools it starts: data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from obs.config_blocks import DeclaredEngine

DEFAULT_OUT = Path("vllm-obs-demo")
DEFAULT_DURATION_S = 60.0
SHORT_DURATION_S = 15.0
DEFAULT_RATE = 4.0
# The load is sized to this share of the pools' probed capacity (obs.demo.story), unless
# --rate is given: busy, with room, so the scripted incident stands out.
LOAD_SHARE = 0.5
ENGINES = ("vllm", "sim")
SCRAPE_INTERVAL_S = 2
# Context length of the tiny model; the demo mix is sized to fit it.
LOCAL_MAX_MODEL_LEN = 2048
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """One local ``vllm serve`` pool: its name in the lanes config and its scheduler flags,
    declared once (``engine``: the pool's ``engine:`` block in the demo's lanes config, from
    which its ``vllm serve`` arguments are generated)."""

    name: str
    engine: DeclaredEngine
    kv_cache_bytes: int
    why: str

    @property
    def vllm_args(self) -> tuple[str, ...]:
        """The ``vllm serve`` arguments of the declared flags."""
        return tuple(self.engine.serve_args())

    def engine_block(self) -> dict[str, object]:
        """The pool's ``engine:`` block for the lanes config."""
        return {"kind": "vllm", **self.engine.values()}

    def describe(self) -> str:
        kv = f"--kv-cache-memory-bytes {self.kv_cache_bytes // MIB}MiB"
        return " ".join((*self.vllm_args, kv))


# The same two pools simulated (obs.engines.sim): an 8B model on one A100-40GB each, with
# few sequences, so a laptop's CPU can drive half its capacity; the tiny model's context and
# name, so the demo mix and lanes fit as they are.
SIM_POOLS = {
    "interactive": (
        "--gpu", "A100-40GB", "--model", "llama-3.1-8b", "--served-model-name", "tiny",
        "--max-model-len", "2048", "--max-num-batched-tokens", "512", "--max-num-seqs", "8",
    ),
    "bulk": (
        "--gpu", "A100-40GB", "--model", "llama-3.1-8b", "--served-model-name", "tiny",
        "--max-model-len", "2048", "--max-num-batched-tokens", "4096", "--max-num-seqs", "8",
    ),
}  # fmt: skip

# The two pools of the shipped lanes config, scaled to the tiny model on a small CPU box.
# About 1 KiB of KV cache per token for the tiny model: 32 MiB holds ~32k tokens.
LOCAL_POOLS = (
    PoolSpec(
        "interactive",
        DeclaredEngine(max_num_seqs=32, max_num_batched_tokens=512),
        32 * MIB,
        "small prefill budget per step: short decode steps for chat, rag, agent, slow-stream",
    ),
    PoolSpec(
        "bulk",
        DeclaredEngine(max_num_seqs=16, max_num_batched_tokens=4096),
        64 * MIB,
        "large prefill budget: throughput for long-prefill and batch",
    ),
)


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """Everything one demo run needs, parsed once from the command line."""

    out: Path = DEFAULT_OUT
    duration_s: float = DEFAULT_DURATION_S
    rate: float | None = None  # None: LOAD_SHARE of the pools' probed capacity
    seed: int = 0
    engine: str = "vllm"  # the local pools: real vLLM on CPU, or simulated GPUs (sim)
    # Clients name their class with X-Client-Class (the labelled run); default: they do not,
    # and the sidecar recognises each class from the request itself.
    class_headers: bool = False
    incident: bool = True  # the scripted incident: a burst of long prompts mid-run
    # Real pools instead of local ones: one URL for every pool, or a whole lanes config.
    upstream: str | None = None
    config: Path | None = None
    # Extra mix overrides (CLASS.FIELD=VALUE), applied after the demo's own.
    mix_sets: tuple[str, ...] = ()
    # The load generator's full default mix (prompts up to 8000 tokens) instead of the
    # demo mix sized for a 2048-token context.
    full_mix: bool = False
    prometheus: bool = True
    # Redraw the live line in place (a terminal) or print periodic lines.
    live_in_place: bool = False

    @property
    def local_pools(self) -> bool:
        """True when the demo starts its own vLLM pools."""
        return self.upstream is None and self.config is None
