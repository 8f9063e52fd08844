"""The simulator's performance model: a named GPU and model, and the time of one engine step.

A roofline per step and per part of the step (docs/sim.md has the derivation and the
sources). One step runs the model once over every token scheduled in it (prefill
chunks and one token per decoding sequence), split over ``tp`` GPUs (tensor
parallelism). Its time is the sum of

- the linear layers: their compute, ``2 x active params`` FLOPs per token at ``mfu`` of
  the GPU's dense peak (FP8 peak for FP8 weights where the GPU has one), and reading the
  weights once (``params x bytes per weight``; of a mixture of experts' routed experts the
  share the step's tokens reach) at ``mbu`` of the memory bandwidth, combined by
  :func:`ridge`: the larger, or with ``roofline_p`` their p-norm, slower than the bound
  near the ridge point where a decode batch's GEMMs sit; all tokens share the read;
- prefill attention: the larger of ``4 x layers x hidden`` FLOPs per (query token,
  context token) pair at ``mfu``, and reading the chunks' context keys and values;
- decode attention: reading each decoding sequence's keys and values (``kv bytes per
  token`` per context token) at ``attn_mbu`` (``mbu`` when 0); it does not overlap the
  prefill's compute, so a mixed step pays both;
- with ``tp > 1``, two all-reduces per layer of the step's activations (``tokens x
  hidden x 2`` bytes): ``allreduce_s`` each plus the ring's ``2 (tp-1)/tp`` of the bytes
  over the GPU's link;
- the CPU's share: ``step_s`` per step plus ``seq_s`` per sequence and ``token_s`` per
  token in the batch (scheduling, input preparation, sampling, the kernel launches);
- a floor of ``layer_s`` per layer per step: the small kernels of every layer (norms,
  rotary embedding, activation quantisation) that run whatever the batch;
- FP8 weights are read at ``fp8_mbu`` of the bandwidth, not ``mbu`` (vLLM's FP8
  scaled-mm kernels at decode batch sizes reach less of it than BF16 GEMMs).

The efficiencies and CPU costs are the fitted numbers (``Calibration``), fitted on the
points bench/sim_calibration.py names as fit points and scored on the others. Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from obs.errors import ConfigError

GIB: Final = 1 << 30
BF16_BYTES: Final = 2


@dataclass(frozen=True, slots=True)
class Gpu:
    """A GPU's public specifications: dense tensor FLOP/s (BF16, FP8 where it has FP8
    tensor cores, else 0), HBM bytes/s, memory in bytes (GiB, as the driver reports it)
    and the bytes/s one GPU sends to a peer (NVLink, or PCIe for cards without it)."""

    name: str
    flops: float
    bandwidth: float
    memory_bytes: float
    fp8_flops: float = 0.0
    link_bandwidth: float = 32e9


@dataclass(frozen=True, slots=True)
class Model:
    """A decoder-only transformer's shape, from its published config.json. A mixture of
    experts (``experts`` > 0) holds ``expert_params`` of its ``params`` in its routed
    experts, of which each token uses ``experts_per_token``; ``kv_per_layer`` is the
    elements of keys and values one token keeps per layer where it is not
    ``2 x kv_heads x head_dim`` (multi-head latent attention's compressed cache)."""

    name: str
    params: float
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    context: int
    experts: int = 0
    experts_per_token: int = 0
    expert_params: float = 0.0
    kv_per_layer: int = 0

    @property
    def active_params(self) -> float:
        """Parameters one token's forward pass multiplies (all of a dense model's)."""
        if not self.experts:
            return self.params
        dense = self.params - self.expert_params
        return dense + self.expert_params * self.experts_per_token / self.experts

    def read_params(self, tokens: int) -> float:
        """Parameters a step of ``tokens`` tokens reads: every dense weight, and of the
        routed experts the share the tokens reach, ``1 - (1 - k/E)^tokens`` under uniform
        routing (each token picks ``k`` of ``E``)."""
        if not self.experts:
            return self.params
        miss = (1 - self.experts_per_token / self.experts) ** max(1, tokens)
        return self.params - self.expert_params * miss


# NVIDIA's and AMD's datasheets (dense, no sparsity); memory as nvidia-smi / rocm-smi
# report it (MiB, here in GiB); links: NVLink 5 (B200) 900 GB/s, NVLink 4 (H100/H200 SXM)
# 450 GB/s and NVLink 3 (A100 SXM) 300 GB/s each way, MI300X's seven Infinity Fabric links
# 64 GB/s each way each, PCIe 4.0 x16 32 GB/s otherwise. docs/sim.md links each sheet. A
# GPU not listed is given as a spec file (obs/engines/sim/specs.py).
GPUS: Final = {
    g.name: g
    for g in (
        Gpu("H100", 989e12, 3.35e12, 81559 / 1024 * GIB, 1979e12, 450e9),  # H100 SXM5 80 GB
        Gpu("H200", 989e12, 4.8e12, 143771 / 1024 * GIB, 1979e12, 450e9),  # H200 SXM 141 GB
        Gpu("B200", 2250e12, 8.0e12, 183359 / 1024 * GIB, 4500e12, 900e9),  # HGX B200, NVLink 5
        Gpu("L40S", 362e12, 0.864e12, 46068 / 1024 * GIB, 733e12),  # PCIe 4.0 x16
        Gpu("MI300X", 1307e12, 5.3e12, 192 * GIB, 2615e12, 448e9),  # 7 Infinity Fabric links
        Gpu("A100", 312e12, 2.039e12, 81920 / 1024 * GIB, 0.0, 300e9),  # A100 SXM4 80 GB
        Gpu("A100-40GB", 312e12, 1.555e12, 40960 / 1024 * GIB, 0.0, 300e9),
        Gpu("L4", 121e12, 0.3e12, 23034 / 1024 * GIB, 242e12),
        Gpu("RTX4090", 165e12, 1.008e12, 24564 / 1024 * GIB, 330e12),  # FP32 accumulate
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
        Model("qwen2.5-0.5b", 0.494e9, 24, 896, 2, 64, 32768),  # tied embeddings
        Model("qwen3-4b", 4.02e9, 36, 2560, 8, 128, 40960),  # tied embeddings
    )
}


WEIGHT_DTYPES: Final = {"bf16": 2, "fp8": 1}  # --quantization (none, fp8): bytes per weight
KV_DTYPES: Final = {"auto": 2, "fp8": 1}  # --kv-cache-dtype: bytes per element


@dataclass(frozen=True, slots=True)
class Calibration:
    """The fitted efficiencies and CPU costs (docs/sim.md, "Calibration")."""

    # python -m bench.sim_calibration --fit (the fit points only; docs/sim.md)
    mfu: float = 0.55  # share of peak FLOP/s reached by prefill matmuls and attention
    mbu: float = 0.875  # share of HBM bandwidth reached by weight and KV reads
    step_s: float = 0.00125  # per step: scheduler, launches, output
    seq_s: float = 40e-6  # per sequence in the step: input preparation, sampling, output
    token_s: float = 10e-6  # per token in the step, outside the roofline's matmuls
    allreduce_s: float = 30e-6  # latency of one all-reduce between the TP GPUs
    memory_utilization: float = 0.9  # vLLM's --gpu-memory-utilization default
    activation_reserve: float = 0.04  # share of GPU memory kept for activations, graphs
    # vLLM V0's CPU costs (0.5-0.6: one process for scheduling, input preparation and
    # sampling, no persistent batch): only for replaying published V0-era runs; the
    # simulator itself is V1 (the fields above).
    v0_step_s: float = 0.0025
    v0_seq_s: float = 10e-6
    v0_token_s: float = 1e-6
    layer_s: float = 0.0  # GPU time per layer per step that no roofline covers (small kernels)
    fp8_mbu: float = 0.7  # share of HBM bandwidth FP8 weight reads reach (scaled-mm kernels)
    # API server event loop's CPU per request (parse the body, build and send the engine's
    # request; the template and tokens are on the tokeniser's thread: frontend.py)
    request_s: float = 0.0005  # chosen from vLLM's source, not fitted (docs/sim.md)
    # per-request latency outside any queue (HTTP, IPC, first detokenize); a host whose own
    # figure is known declares it instead (bench/sim_calibration.py's host_floor)
    first_token_s: float = 0.015
    # How the linear layers' compute and weight reads combine: 0 takes the larger (the
    # roofline's bound), p > 0 the p-norm (c^p + m^p)^(1/p), slower than the bound where the
    # two are alike (a GEMM near the ridge point reaches neither ceiling; docs/sim.md).
    roofline_p: float = 0.0
    # Per step after the first of a multi-step schedule: the model runner's launch of the
    # forward pass, sampler and advance_step (vLLM 0.6, PR #7000's MultiStepModelRunner).
    multistep_s: float = 0.001
    # Per step with tensor parallelism, x log2(tp): the scheduler's output handed to the TP
    # workers and their start in step (V1's MultiprocExecutor broadcasts it over a shared-
    # memory MessageQueue each step, V0's driver broadcast_tensor_dict; a tree of log2(tp)).
    tp_step_s: float = 0.0
    # Share of HBM bandwidth the decode attention kernels reach reading each sequence's keys
    # and values (0: mbu). Paged decode kernels read many short, scattered block lists, one
    # thread block per sequence and head group, and reach less of it than a weight GEMM
    # (FlashInfer, Ye et al., MLSys 2025, arXiv:2501.01005, measures decode attention's
    # bandwidth use by batch and length): the per-sequence cost that grows with the batch.
    attn_mbu: float = 0.0

    def engine(self, name: str) -> Calibration:
        """These numbers for vLLM's ``"v1"`` engine (as they are) or ``"v0"``."""
        if name == "v1":
            return self
        if name != "v0":
            raise ConfigError(f"engine {name!r}: choose v1 or v0")
        return replace(self, step_s=self.v0_step_s, seq_s=self.v0_seq_s, token_s=self.v0_token_s)


CALIBRATION: Final = Calibration()


@dataclass(frozen=True, slots=True)
class StepWork:
    """What one step computes: tokens and sequences in the batch, and the attention they
    do. ``decode_*`` are the decoding sequences' share of the totals (0: none known)."""

    tokens: int  # prefill chunk tokens + one per decoding sequence
    attention_pairs: float  # sum over sequences of new tokens x context they attend to
    kv_read_tokens: float  # context tokens whose keys and values the step reads
    seqs: int = 0  # sequences in the batch (0: unknown, taken as 1)
    decode_kv_tokens: float = 0.0  # context tokens the decoding sequences read


@dataclass(frozen=True, slots=True)
class PerfModel:
    gpu: Gpu
    model: Model
    cal: Calibration = CALIBRATION
    tp: int = 1  # --tensor-parallel-size
    weights: str = "bf16"  # "fp8" with --quantization fp8
    kv_dtype: str = "auto"  # --kv-cache-dtype

    @property
    def weight_bytes(self) -> float:
        return self.model.params * WEIGHT_DTYPES[self.weights]

    @property
    def kv_bytes_per_token(self) -> float:
        """Keys and values of every layer for one token, on all GPUs together."""
        m = self.model
        per_layer = m.kv_per_layer or 2 * m.kv_heads * m.head_dim
        return m.layers * per_layer * KV_DTYPES[self.kv_dtype]

    @property
    def peak_flops(self) -> float:
        fp8 = self.weights == "fp8" and self.gpu.fp8_flops > 0
        return self.gpu.fp8_flops if fp8 else self.gpu.flops

    def step_seconds(self, work: StepWork) -> float:
        """Seconds one step takes (0 for an empty step)."""
        if work.tokens <= 0:
            return 0.0
        m, g, cal, tp = self.model, self.gpu, self.cal, self.tp
        flops = g.flops * cal.mfu * tp
        linear_flops = self.peak_flops * cal.mfu * tp
        bandwidth = g.bandwidth * cal.mbu * tp
        weight_bandwidth = g.bandwidth * (cal.fp8_mbu if self.weights == "fp8" else cal.mbu) * tp
        kv = self.kv_bytes_per_token
        weight_bytes = m.read_params(work.tokens) * WEIGHT_DTYPES[self.weights]
        linear = ridge(
            2.0 * m.active_params * work.tokens / linear_flops,
            weight_bytes / weight_bandwidth,
            cal.roofline_p,
        )
        decode_kv = min(work.decode_kv_tokens, work.kv_read_tokens)
        prefill_pairs = max(0.0, work.attention_pairs - decode_kv)
        prefill = max(
            4.0 * m.layers * m.hidden * prefill_pairs / flops,
            kv * (work.kv_read_tokens - decode_kv) / bandwidth,
        )
        decode = kv * decode_kv / (g.bandwidth * (cal.attn_mbu or cal.mbu) * tp)
        floor = cal.layer_s * m.layers  # every layer's small kernels, whatever the batch
        gpu = floor + linear + prefill + decode + self.comm_seconds(work.tokens)
        return self.cpu_seconds(work) + gpu

    def cpu_seconds(self, work: StepWork) -> float:
        """The CPU's share of a step like ``work``: scheduling, input preparation, sampling
        and output (a multi-step schedule pays it once for its N steps)."""
        cal = self.cal
        return cal.step_s + cal.seq_s * max(1, work.seqs) + cal.token_s * work.tokens

    def lockstep_seconds(self, work: StepWork, steps: int) -> float:
        """Seconds of ``steps`` steps like ``work`` run from one schedule (vLLM 0.6's
        multi-step scheduling): the GPU's work every step, the scheduler's and the inputs'
        preparation once, and every step after the first the model runner's own launch
        (``multistep_s``: vLLM 0.6's ``MultiStepModelRunner`` runs the forward pass, the
        sampler and ``advance_step`` from Python for each of the N steps)."""
        cpu = self.cpu_seconds(work)
        return cpu + steps * (self.step_seconds(work) - cpu) + (steps - 1) * self.cal.multistep_s

    def comm_seconds(self, tokens: int) -> float:
        """Two ring all-reduces per layer of ``tokens`` activations, and the step's hand-over
        to the TP workers (0 without TP)."""
        if self.tp <= 1:
            return 0.0
        size = tokens * self.model.hidden * 2  # BF16 activations
        ring = 2 * (self.tp - 1) / self.tp * size / self.gpu.link_bandwidth
        workers = self.cal.tp_step_s * math.log2(self.tp)
        return 2 * self.model.layers * (self.cal.allreduce_s + ring) + workers

    def kv_blocks(self, block_size: int, memory_utilization: float | None = None) -> int:
        """Blocks of KV cache the GPUs hold after the weights, as vLLM sizes it: each GPU
        keeps its 1/tp of the weights and of every token's keys and values."""
        share = memory_utilization or self.cal.memory_utilization
        free = self.gpu.memory_bytes * (share - self.cal.activation_reserve) - (
            self.weight_bytes / self.tp
        )
        per_gpu = self.kv_bytes_per_token * max(1, self.model.kv_heads // self.tp)
        per_gpu /= self.model.kv_heads
        blocks = int(free // (per_gpu * block_size))
        if blocks <= 0:
            raise ConfigError(
                f"model {self.model.name} ({self.weights} weights) does not fit "
                f"{self.tp} x GPU {self.gpu.name} ({self.gpu.memory_bytes / GIB:.1f} GiB at "
                f"{share:g} utilization): try --tensor-parallel-size {self.tp * 2} or "
                "--quantization fp8"
            )
        return blocks


def ridge(compute: float, memory: float, p: float) -> float:
    """A kernel's time from its compute and memory times: the larger (``p`` 0), else their
    p-norm, which is the larger far from the ridge point and up to 2^(1/p) times it on it."""
    if p <= 0:
        return max(compute, memory)
    big = max(compute, memory)
    if big <= 0:
        return 0.0
    return big * ((compute / big) ** p + (memory / big) ** p) ** (1 / p)


def find_gpu(gpu: str | Gpu) -> Gpu:
    """A preset GPU by name (case-insensitive) or the one a spec file describes."""
    if isinstance(gpu, Gpu):
        return gpu
    g = {k.lower(): v for k, v in GPUS.items()}.get(gpu.lower())
    if g is not None:
        return g
    from obs.engines.sim import specs  # a file: the only I/O, on request

    if specs.looks_like_path(gpu):
        return specs.load_gpu(Path(gpu))
    raise ConfigError(
        f"--gpu {gpu!r}: choose one of {', '.join(GPUS)}, or give a spec file (docs/sim.md)"
    )


def find_model(model: str | Model) -> Model:
    """A preset model by name (case-insensitive) or the one a config.json describes."""
    if isinstance(model, Model):
        return model
    m = MODELS.get(model.lower())
    if m is not None:
        return m
    from obs.engines.sim import specs

    if specs.looks_like_path(model):
        return specs.load_model(Path(model))
    raise ConfigError(
        f"--model {model!r}: choose one of {', '.join(MODELS)}, or give a Hugging Face "
        "config.json (--model-config PATH)"
    )


def perf_model(
    gpu: str | Gpu,
    model: str | Model,
    tp: int = 1,
    weights: str = "bf16",
    kv_dtype: str = "auto",
) -> PerfModel:
    """The performance model of a GPU and model, each a preset's name or a file (a GPU
    spec, a Hugging Face config.json: obs.engines.sim.specs)."""
    g, m = find_gpu(gpu), find_model(model)
    if tp not in (1, 2, 4, 8):
        raise ConfigError(f"--tensor-parallel-size {tp}: choose 1, 2, 4 or 8")
    if m.kv_heads % tp and tp % m.kv_heads:
        raise ConfigError(f"--tensor-parallel-size {tp}: {m.name}'s {m.kv_heads} KV heads")
    if weights not in WEIGHT_DTYPES:
        raise ConfigError(f"--quantization {weights!r}: choose fp8 (or none)")
    if kv_dtype not in KV_DTYPES:
        raise ConfigError(f"--kv-cache-dtype {kv_dtype!r}: choose auto or fp8")
    return PerfModel(g, m, tp=tp, weights=weights, kv_dtype=kv_dtype)


def with_calibration(perf: PerfModel, cal: Calibration) -> PerfModel:
    """``perf`` with other fitted numbers (the calibration's fit, the CLI's memory share)."""
    return replace(perf, cal=cal)
