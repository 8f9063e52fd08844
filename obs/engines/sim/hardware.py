"""The simulator's performance model: a named GPU and model, and the time of one engine step.

A roofline per step (docs/sim.md has the derivation and the sources): one step runs
the model once over every token scheduled in it (prefill chunks and one token per
decoding sequence). It costs the larger of

- compute: ``2 x params`` FLOPs per token plus attention, ``4 x layers x hidden`` FLOPs
  per (query token, context token) pair, at ``mfu`` of the GPU's dense BF16 peak;
- memory: the weights once (``2 x params`` bytes, BF16) plus the KV cache the step's
  attention reads (``kv_bytes_per_token`` per context token), at ``mbu`` of the GPU's
  memory bandwidth;

plus a fixed ``step_overhead_s`` for the scheduler, sampling and the kernel launches
around the model. The efficiencies are the only fitted numbers (``calibration``), set
from the published measurements docs/sim.md lists. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from obs.errors import ConfigError

BF16_BYTES: Final = 2


@dataclass(frozen=True, slots=True)
class Gpu:
    """A GPU's public specifications (dense BF16 tensor FLOP/s, HBM bytes/s and bytes)."""

    name: str
    flops: float
    bandwidth: float
    memory_bytes: float


@dataclass(frozen=True, slots=True)
class Model:
    """A decoder-only transformer's shape, from its published config.json."""

    name: str
    params: float
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    context: int

    @property
    def weight_bytes(self) -> float:
        return self.params * BF16_BYTES

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of every layer for one token, BF16."""
        return 2 * self.layers * self.kv_heads * self.head_dim * BF16_BYTES


# NVIDIA datasheets (dense, no sparsity); see docs/sim.md for the links.
GPUS: Final = {
    g.name: g
    for g in (
        Gpu("H100", 989e12, 3.35e12, 80e9),  # H100 SXM5 80 GB
        Gpu("H200", 989e12, 4.8e12, 141e9),
        Gpu("A100", 312e12, 2.039e12, 80e9),  # A100 SXM4 80 GB
        Gpu("A100-40GB", 312e12, 1.555e12, 40e9),
        Gpu("L4", 121e12, 0.3e12, 24e9),
        Gpu("RTX4090", 165e12, 1.008e12, 24e9),  # FP16 tensor, FP32 accumulate
    )
}
# Hugging Face config.json of each model (parameters from the model card).
MODELS: Final = {
    m.name: m
    for m in (
        Model("llama-3.1-8b", 8.03e9, 32, 4096, 8, 128, 131072),
        Model("llama-3.1-70b", 70.6e9, 80, 8192, 8, 128, 131072),
        Model("mistral-7b", 7.25e9, 32, 4096, 8, 128, 32768),
        Model("qwen2.5-7b", 7.62e9, 28, 3584, 4, 128, 32768),
    )
}


@dataclass(frozen=True, slots=True)
class Calibration:
    """The fitted efficiencies (docs/sim.md, "Calibration")."""

    mfu: float = 0.5  # share of peak FLOP/s reached by large prefill matmuls
    mbu: float = 0.8  # share of HBM bandwidth reached by decode (weights + KV reads)
    step_overhead_s: float = 0.003  # scheduler, sampling, launches: per step
    memory_utilization: float = 0.9  # vLLM's --gpu-memory-utilization default
    activation_reserve: float = 0.04  # share of GPU memory kept for activations, graphs


CALIBRATION: Final = Calibration()


@dataclass(frozen=True, slots=True)
class StepWork:
    """What one step computes: tokens in the batch and the attention it does."""

    tokens: int  # prefill chunk tokens + one per decoding sequence
    attention_pairs: float  # sum over sequences of new tokens x context they attend to
    kv_read_tokens: float  # context tokens whose keys and values the step reads


@dataclass(frozen=True, slots=True)
class PerfModel:
    gpu: Gpu
    model: Model
    cal: Calibration = CALIBRATION

    def step_seconds(self, work: StepWork) -> float:
        """Seconds one step takes (0 for an empty step)."""
        if work.tokens <= 0:
            return 0.0
        m = self.model
        flops = 2.0 * m.params * work.tokens + 4.0 * m.layers * m.hidden * work.attention_pairs
        read = m.weight_bytes + m.kv_bytes_per_token * work.kv_read_tokens
        compute = flops / (self.gpu.flops * self.cal.mfu)
        memory = read / (self.gpu.bandwidth * self.cal.mbu)
        return self.cal.step_overhead_s + max(compute, memory)

    def kv_blocks(self, block_size: int, memory_utilization: float | None = None) -> int:
        """Blocks of KV cache the GPU holds after the weights, as vLLM sizes it."""
        share = memory_utilization or self.cal.memory_utilization
        free = self.gpu.memory_bytes * (share - self.cal.activation_reserve) - (
            self.model.weight_bytes
        )
        blocks = int(free // (self.model.kv_bytes_per_token * block_size))
        if blocks <= 0:
            raise ConfigError(
                f"model {self.model.name} does not fit GPU {self.gpu.name} "
                f"({self.gpu.memory_bytes / 1e9:g} GB at {share:g} utilization)"
            )
        return blocks


def perf_model(gpu: str, model: str) -> PerfModel:
    """The performance model of a named GPU and model; names are case-insensitive."""
    g = {k.lower(): v for k, v in GPUS.items()}.get(gpu.lower())
    if g is None:
        raise ConfigError(f"--gpu {gpu!r}: choose one of {', '.join(GPUS)}")
    m = MODELS.get(model.lower())
    if m is None:
        raise ConfigError(f"--model {model!r}: choose one of {', '.join(MODELS)}")
    return PerfModel(g, m)
