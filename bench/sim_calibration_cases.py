"""The published runs the simulator is calibrated and scored on (bench/sim_calibration.py).

Each :class:`Case` is one published run and the figures it gives; ``held_out`` was
fixed for every case before any was scored (docs/sim.md, "Calibration", cites each).
The first sources' points are here, all fit points; the later ones and the held-out
points are in bench/sim_calibration_points.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.sim_calibration_replay import PromptSet

MUSGRAVE = "https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on"
RAHMAN = "https://mushfiqrahman.dev/?p=1668"
# vLLM's performance-benchmark pipeline (Buildkite): its report of the latency tests. The
# H100 and A100 reports are the copies the search index holds under the addresses below.
CI_H200 = "https://buildkite.com/vllm/performance-benchmark/builds/9515"
CI_H100 = "https://buildkite.com/elastic/enterprise-search-ruby/builds/571"
CI_A100 = "https://buildkite.com/julialang/opencl-dot-jl/builds/306"
LAMBDA = "https://github.com/LambdaLabsML/vllm-benchmark/blob/{commit}/{path}"
LAMBDA_MISTRAL = LAMBDA.format(
    commit="de55d46ea652cfc8f3edd3121a7a826f47d20611",
    path="results/prompt_10/1xH100-80GB-SXM/Mistral-7B-Instruct-v0.3_tp1_len2000.json",
)
LAMBDA_MISTRAL_STEP10 = LAMBDA.format(
    commit="a4f9f4371a1ccac781293837fce2bce0cc6d25cc",
    path="results/prompt_10/1xH100-80GB-SXM/Mistral-7B-Instruct-v0.3_tp1_len2048.json",
)
LAMBDA_8B_FP8 = LAMBDA.format(
    commit="de55d46ea652cfc8f3edd3121a7a826f47d20611",
    path="results/prompt_10/1xH100-80GB-SXM/Meta-Llama-3.1-8B-FP8_tp1_len8000.json",
)
LAMBDA_70B_TP1 = LAMBDA.format(
    commit="de55d46ea652cfc8f3edd3121a7a826f47d20611",
    path="results/prompt_10/1xH100-80GB-SXM/Meta-Llama-3.1-70B-Instruct-FP8_tp1_len2000.json",
)
# A concurrency sweep of vLLM 0.23 on one L4 (its "serving/raw-vllm" table).
WMX = "https://ai.wmx.dev/benchmarks"
WMX_C1_TTFT_P50 = 27.0  # its concurrency-1 row: the host's floor since round 5 (not scored)
# Tenstorrent's GPU reference runs of vLLM (tt-inference-server's benchmark sweep on an RTX
# 4090, Qwen3-4B): registered in round 3 as a third source.
TT_4090 = "https://github.com/tenstorrent/tt-inference-server/issues/394"
LAMBDA_70B = LAMBDA.format(
    commit="a4f9f4371a1ccac781293837fce2bce0cc6d25cc",
    path="results/prompt_10/4xH100-80GB-SXM/Meta-Llama-3.1-70B-Instruct-FP8_tp4_len2048.json",
)
SHAREGPT_10_IN = (14, 30, 28, 12, 375, 29, 487, 369, 5, 236)  # Mistral tokenizer
LLAMA_SHAREGPT_10_IN = (13, 25, 27, 10, 329, 29, 399, 328, 4, 205)  # Llama-3 tokenizer


@dataclass(frozen=True, slots=True)
class Case:
    """One published run and the figures it gives (metric name -> published value)."""

    name: str
    source: str
    note: str  # what the run was: vLLM version, flags, where each figure is read
    gpu: str
    model: str
    kind: str  # "closed", "batch" or "replay"
    published: dict[str, float]
    held_out: bool
    tp: int = 1
    weights: str = "bf16"
    input_tokens: int = 0
    output_tokens: int = 0
    concurrency: int = 1
    prompts: int = 0
    mean_output: float = 0.0  # published output tokens per request (0: all output_tokens)
    inputs: tuple[int, ...] = ()
    outputs: tuple[int, ...] = ()
    derived: dict[str, str] = field(default_factory=dict)  # metric -> how it was derived
    # How the run's vLLM scheduled (round 3): "v1" (the engine since 0.8: chunked prefill,
    # GPU-dependent defaults) or "v0" (0.5-0.6: no chunked prefill below a 32k context).
    engine: str = "v0"
    max_model_len: int = 0  # --max-model-len (0: the model's context)
    # Figures the fit leaves out (round 4), each with why: scored and shown, not fitted.
    unfit: dict[str, str] = field(default_factory=dict)
    # Round 5: vLLM 0.6's --num-scheduler-steps (1: single-step scheduling).
    scheduler_steps: int = 1
    # Round 5: the same host's published TTFT at concurrency 1 for the same workload (ms, the
    # metric the case scores; 0: none). The host's per-request floor is then declared by
    # rule from it (bench/sim_calibration.py: host_floor) instead of the fitted default.
    host_c1_ttft_ms: float = 0.0
    max_num_seqs: int = 0  # the run's --max-num-seqs (0: vLLM's default)
    # Why a held-out run lies outside the model's declared domain ("": inside). Scored and
    # counted for the bars all the same; the plan's margin reads the points inside it.
    outside_domain: str = ""
    # Round 6: the source's own prompt list (None: random prompts) and its client's warm-up
    # (it first sends that many requests per unit of concurrency, unmeasured).
    prompt_set: PromptSet | None = None
    warmup_rounds: int = 0

    @property
    def workload(self) -> str:
        if self.kind == "closed":
            return (
                f"{self.input_tokens} in / {self.output_tokens} out, concurrency {self.concurrency}"
            )
        if self.kind == "batch":
            return f"{self.input_tokens} in / {self.output_tokens} out, batch of {self.prompts}"
        return f"{len(self.inputs)} ShareGPT prompts at once (published lengths)"


def _rahman(c: int, req_s: float, tok_s: float, ttft: float) -> Case:
    return Case(
        f"rtx4090-mistral-c{c}",
        RAHMAN,
        "Mistral-7B-Instruct-v0.3, --tokenizer-mode mistral, 300 prompts, max_tokens 128, no "
        f"--ignore-eos (answers end with a fixed chance per token, capped at 128, at the "
        f"published mean {tok_s / req_s:.1f} = output tok/s / req/s; vLLM V1 assumed); the "
        "table's output tok/s and mean TTFT",
        "RTX4090",
        "mistral-7b",
        "closed",
        {"output_tok_s": tok_s, "ttft_ms": ttft},
        held_out=False,
        input_tokens=256,
        output_tokens=128,
        concurrency=c,
        prompts=300,
        mean_output=tok_s / req_s,
        engine="v1",
    )


def ci_latency(gpu: str, url: str, model: str, tp: int, latency_ms: float, held_out: bool) -> Case:
    return Case(
        f"ci-{gpu.lower()}-{model}-tp{tp}",
        url,
        "vLLM performance benchmark, latency test (benchmark_latency.py, input 32, output "
        f"128, batch 8), {model.replace('llama-3.1-70b', 'Llama-3-70B')} TP{tp}: mean latency",
        gpu,
        model,
        "batch",
        {"latency_ms": latency_ms},
        held_out=held_out,
        tp=tp,
        input_tokens=32,
        output_tokens=128,
        prompts=8,
    )


def lambda_replay(
    name: str,
    url: str,
    about: str,
    model: str,
    published: dict[str, float],
    inputs: tuple[int, ...],
    outputs: tuple[int, ...],
    *,
    held_out: bool,
    **kw: object,
) -> Case:
    """One of Lambda's vllm-benchmark runs (``benchmark_serving.py``, 10 ShareGPT prompts
    at once, their published lengths) on H100s, vLLM V0."""
    return Case(
        name,
        url,
        about,
        "H100",
        model,
        "replay",
        published,
        held_out=held_out,
        inputs=inputs,
        outputs=outputs,
        engine="v0",
        **kw,  # type: ignore[arg-type]
    )


def wmx_l4(
    c: int, tok_s: float, ttft: float, itl: float, *, held_out: bool, why: str, c1: float = 0.0
) -> Case:
    """A row of the ai.wmx.dev L4 sweep (``why``: what the note adds to the prompts'
    count; ``c1``: the table's concurrency-1 TTFT p50, the host's floor, from round 5)."""
    return Case(
        f"l4-qwen0.5b-c{c}",
        WMX,
        "vLLM 0.23.0 (V1), Qwen/Qwen2.5-0.5B-Instruct BF16, --gpu-memory-utilization 0.6 "
        "--max-model-len 8192, vllm bench serve, random 256 in / 128 out, --ignore-eos, "
        f"--request-rate inf --max-concurrency {c} (--num-prompts not given: the "
        f"default 1000 assumed{why}): output tok/s, TTFT p50, ITL p50",
        "L4",
        "qwen2.5-0.5b",
        "closed",
        {"output_tok_s": tok_s, "ttft_p50_ms": ttft, "itl_p50_ms": itl},
        held_out=held_out,
        input_tokens=256,
        output_tokens=128,
        concurrency=c,
        prompts=1000,
        engine="v1",
        max_model_len=8192,
        host_c1_ttft_ms=c1,
    )


def tt_4090(
    name: str, isl: int, osl: int, n: int, ttft: float, tpot: float, *, held_out: bool, why: str
) -> Case:
    """A concurrency-1 row of Tenstorrent's RTX 4090 Qwen3-4B reference (``why``: the note's
    account of ``--ignore-eos`` and the engine)."""
    return Case(
        name,
        TT_4090,
        "Tenstorrent tt-inference-server, GPU reference sweep (gtobarTT, 2025-11-12), "
        f"Qwen/Qwen3-4B BF16 on one RTX 4090, vLLM's serving benchmark, random {isl} in / "
        f"{osl} out, concurrency 1, {n} requests (--ignore-eos{why}): mean TTFT and TPOT",
        "RTX4090",
        "qwen3-4b",
        "closed",
        {"ttft_ms": ttft, "tpot_ms": tpot},
        held_out=held_out,
        input_tokens=isl,
        output_tokens=osl,
        concurrency=1,
        prompts=n,
        engine="v1",
        unfit={"ttft_ms": PAST_PEAK} if isl > 128 else {},
    )


FIT: tuple[Case, ...] = (
    # ---- fit points -------------------------------------------------------------------
    _rahman(4, 2.09, 210.0, 63.0),
    _rahman(8, 3.78, 377.0, 79.0),
    _rahman(16, 6.44, 644.0, 155.0),
    _rahman(32, 9.73, 975.0, 362.0),
    _rahman(48, 11.87, 1190.0, 667.0),
    Case(
        "a100-40gb-8b-c1",
        MUSGRAVE,
        "vLLM 0.23, Llama-3.1-8B-Instruct BF16, --ignore-eos: 'decode at one request per "
        "time runs at about 75 tokens/sec' (the decode rate, 1 / ITL)",
        "A100-40GB",
        "llama-3.1-8b",
        "closed",
        {"decode_tok_s": 75.0},
        held_out=False,
        input_tokens=1024,
        output_tokens=128,
        concurrency=1,
        prompts=20,
        engine="v1",
    ),
    ci_latency("H200", CI_H200, "llama-3.1-8b", 1, 833.421, held_out=False),
    ci_latency("H200", CI_H200, "llama-3.1-70b", 4, 2077.53, held_out=False),
    # Rounds 1-2's held-out points: fit points since round 3 (they had been seen).
    ci_latency("H100", CI_H100, "llama-3.1-8b", 1, 997.542, held_out=False),
    ci_latency("H100", CI_H100, "llama-3.1-70b", 4, 2444.47, held_out=False),
    ci_latency("A100", CI_A100, "llama-3.1-8b", 1, 1585.43, held_out=False),
    Case(
        "a100-40gb-8b-c8",
        MUSGRAVE,
        "vLLM 0.23, Llama-3.1-8B-Instruct BF16, --ignore-eos, --max-concurrency 8, 160 "
        "prompts: output tok/s",
        "A100-40GB",
        "llama-3.1-8b",
        "closed",
        {"output_tok_s": 495.0},
        held_out=False,
        input_tokens=1024,
        output_tokens=128,
        concurrency=8,
        prompts=160,
        engine="v1",
        derived={"output_tok_s": "the text's 'a 6.6x gain' over 75 tokens/s at concurrency 1"},
    ),
    lambda_replay(
        "lambda-h100-mistral-10",
        LAMBDA_MISTRAL,
        "vLLM 0.5.4, Mistral-7B-Instruct-v0.3 BF16, benchmark_serving.py, 10 ShareGPT "
        "prompts, --request-rate inf: mean TTFT, mean TPOT, output throughput",
        "mistral-7b",
        {"ttft_ms": 51.8117, "tpot_ms": 8.9538, "output_tok_s": 336.735},
        SHAREGPT_10_IN,
        (129, 890, 273, 169, 0, 928, 10, 26, 8, 57),
        held_out=False,
        max_model_len=2000,
    ),
    lambda_replay(
        "lambda-h100-mistral-10-step10",
        LAMBDA_MISTRAL_STEP10,
        "vLLM 0.6.0 with --num-scheduler-steps 10 (tokens come 10 at a time, so only the "
        "TPOT is scored), Mistral-7B-Instruct-v0.3 BF16, the same 10 prompts: mean TPOT",
        "mistral-7b",
        {"tpot_ms": 7.4837},
        SHAREGPT_10_IN,
        (129, 883, 273, 169, 0, 928, 10, 26, 8, 57),
        held_out=False,
        max_model_len=2048,
        scheduler_steps=10,
    ),
    lambda_replay(
        "lambda-4xh100-70b-fp8-10-step10",
        LAMBDA_70B,
        "vLLM 0.6.0 with --num-scheduler-steps 10 (only the TPOT is scored), "
        "neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8, TP4, 10 ShareGPT prompts: mean TPOT",
        "llama-3.1-70b",
        {"tpot_ms": 14.6894},
        LLAMA_SHAREGPT_10_IN,
        (120, 770, 233, 194, 101, 741, 0, 0, 6, 63),
        held_out=False,
        tp=4,
        weights="fp8",
        max_model_len=2048,
        scheduler_steps=10,
    ),
)


# ---- round 3's held-out points, registered before any of them was simulated -------------
# (git log shows this list committed before the model ran on it; docs/sim.md, "Round 3").
# Seen in round 3's evaluation, so fit points since round 4.

ROUND3: tuple[Case, ...] = (
    lambda_replay(
        "lambda-h100-8b-fp8-10",
        LAMBDA_8B_FP8,
        "vLLM 0.5.4, neuralmagic/Meta-Llama-3.1-8B-FP8 (FP8 weights), --max-model-len 8000, "
        "benchmark_serving.py, 10 ShareGPT prompts, --request-rate inf: mean TTFT, mean "
        "TPOT, output throughput",
        "llama-3.1-8b",
        {
            "ttft_ms": 38.39956070296466,
            "tpot_ms": 6.274846723527093,
            "output_tok_s": 252.31865646135873,
        },
        (13, 25, 27, 10, 329, 29, 399, 328, 4, 205),
        (120, 1, 1, 194, 0, 741, 0, 0, 6, 80),
        held_out=False,
        weights="fp8",
        max_model_len=8000,
    ),
    lambda_replay(
        "lambda-h100-70b-fp8-tp1-10",
        LAMBDA_70B_TP1,
        "vLLM 0.5.4, neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8 on one H100, "
        "--max-model-len 2000, benchmark_serving.py, 10 ShareGPT prompts, --request-rate "
        "inf: mean TTFT, mean TPOT, output throughput",
        "llama-3.1-70b",
        {
            "ttft_ms": 155.46229612082243,
            "tpot_ms": 33.114848840998754,
            "output_tok_s": 100.03195461500722,
        },
        (12, 24, 26, 9, 328, 28, 398, 327, 204, 15),
        (119, 769, 232, 193, 0, 740, 0, 0, 79, 391),
        held_out=False,
        weights="fp8",
        max_model_len=2000,
    ),
    wmx_l4(8, 1312.0, 60.9, 5.5, held_out=False, why="", c1=WMX_C1_TTFT_P50),
    wmx_l4(32, 3773.0, 135.3, 7.1, held_out=False, why="", c1=WMX_C1_TTFT_P50),
)


PAST_PEAK = (
    "prefilling 1024-2048 prompt tokens of a 4B model in the published time takes 210-290 "
    "TFLOP/s, past the RTX 4090's 165 TFLOP/s BF16 peak: the run was not the BF16 one its "
    "table states (FP8, or a prefix-cache hit), so no BF16 roofline can fit it"
)

# Registered in a second commit, still before any evaluation (a third source found).
ROUND3 += tuple(
    tt_4090(
        f"tt-4090-qwen3-4b-{isl}in-c1",
        isl,
        128,
        n,
        ttft,
        tpot,
        held_out=False,
        why=": the table's E2EL is TTFT + 127 TPOT; vLLM V1 assumed, the default since 0.8",
    )
    for isl, n, ttft, tpot in ((128, 8, 33.1, 10.5), (1024, 4, 62.1, 10.3), (2048, 4, 77.7, 10.8))
)


def source_name(url: str) -> str:
    """The independent source a point comes from (vLLM's CI reports count as one)."""
    if "buildkite.com" in url:
        return "vLLM performance benchmark (CI)"
    if "github.com/ree2raz/inference-bench/" in url:
        return "ree2raz, inference-bench"
    return {
        MUSGRAVE: "Musgrave, A100 sweep",
        RAHMAN: "Rahman, RTX 4090 sweep",
        WMX: "ai.wmx.dev, L4 sweep",
        TT_4090: "Tenstorrent, GPU reference sweep",
    }.get(url, "Lambda, vllm-benchmark")
