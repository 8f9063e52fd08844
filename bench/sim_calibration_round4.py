"""Round 4's held-out points, registered before the frozen model (b6b41be) ran on any of them.

Published figures used in none of rounds 1-3 (docs/sim.md, "Round 4", cites each), taken by
one rule: every figure of the runs below that the simulator publishes, except a figure whose
published value needs more than the GPU's peak (the rule the fit already applies:
``PAST_PEAK``). Three sources: Lambda's vllm-benchmark results (other files of the repository
than rounds 1-3 read: one H100, other vLLM versions and context limits), the ai.wmx.dev L4
sweep (the concurrency 2, 4 and 16 rows; rounds 1-3 read the 8 and 32 rows, and round 3's
analysis the 1 row, so that row is left out), and Tenstorrent's RTX 4090 Qwen3-4B reference
(its 128-in / 1024-out row; the 3072- and 4096-token rows are past the card's peak: 82.6 and
76.6 ms to prefill 3-4k tokens of a 4B model, 300-430 TFLOP/s).
"""

from __future__ import annotations

from bench.sim_calibration_cases import (
    FIT,
    LAMBDA,
    LLAMA_SHAREGPT_10_IN,
    ROUND3,
    SHAREGPT_10_IN,
    WMX_C1_TTFT_P50,
    Case,
    lambda_replay,
    tt_4090,
    wmx_l4,
)

LAMBDA_MISTRAL_8000 = LAMBDA.format(
    commit="de55d46ea652cfc8f3edd3121a7a826f47d20611",
    path="results/prompt_10/1xH100-80GB-SXM/Mistral-7B-Instruct-v0.3_tp1_len8000.json",
)
LAMBDA_LLAMA3_8B_4096 = LAMBDA.format(
    commit="bf5465745a4abd8899fff87a52e780449921425a",
    path="results/prompt_10/1xH100-80GB-SXM/Meta-Llama-3-8B-Instruct_tp1_len4096.json",
)
LAMBDA_8B_FP8_2048 = LAMBDA.format(
    commit="a4f9f4371a1ccac781293837fce2bce0cc6d25cc",
    path="results/prompt_10/1xH100-80GB-SXM/Meta-Llama-3.1-8B-FP8_tp1_len2048.json",
)
LAMBDA_70B_FP8_TP1_2048 = LAMBDA.format(
    commit="a4f9f4371a1ccac781293837fce2bce0cc6d25cc",
    path="results/prompt_10/1xH100-80GB-SXM/Meta-Llama-3.1-70B-Instruct-FP8_tp1_len2048.json",
)
_STEP10 = (
    "tokens come 10 at a time (mean ITL {itl} ms, 10 steps), so, as for round 1's "
    "--num-scheduler-steps 10 runs, only the mean TPOT is scored"
)


def _lambda_step10(
    name: str,
    url: str,
    about: str,
    model: str,
    weights: str,
    tpot: float,
    itl: str,
    outputs: tuple[int, ...],
    max_model_len: int,
) -> Case:
    return lambda_replay(
        name,
        url,
        f"{about}, benchmark_serving.py, 10 ShareGPT prompts, --request-rate inf; "
        + _STEP10.format(itl=itl),
        model,
        {"tpot_ms": tpot},
        LLAMA_SHAREGPT_10_IN,
        outputs,
        held_out=True,
        weights=weights,
        max_model_len=max_model_len,
        scheduler_steps=10,  # round 5: vLLM 0.6's multi-step scheduling, now modelled
    )


ROUND4_HELD_OUT: tuple[Case, ...] = (
    lambda_replay(
        "lambda-h100-mistral-10-len8000",
        LAMBDA_MISTRAL_8000,
        "vLLM 0.5.4, Mistral-7B-Instruct-v0.3 BF16, --max-model-len 8000, benchmark_serving.py, "
        "10 ShareGPT prompts, --request-rate inf: mean TTFT, mean TPOT, output throughput",
        "mistral-7b",
        {
            "ttft_ms": 53.304909297730774,
            "tpot_ms": 8.466257924850858,
            "output_tok_s": 328.7230119360912,
        },
        SHAREGPT_10_IN,
        (129, 883, 273, 169, 0, 928, 10, 26, 8, 57),
        held_out=True,
        max_model_len=8000,
    ),
    _lambda_step10(
        "lambda-h100-llama3-8b-10-len4096-step10",
        LAMBDA_LLAMA3_8B_4096,
        "vLLM 0.6 (2024-09-08), meta-llama/Meta-Llama-3-8B-Instruct BF16 (Llama-3.1-8B's "
        "shape), --max-model-len 4096",
        "llama-3.1-8b",
        "bf16",
        10.96305801676226,
        "72.2",
        outputs=(120, 393, 233, 194, 101, 741, 9, 3, 6, 31),
        max_model_len=4096,
    ),
    _lambda_step10(
        "lambda-h100-8b-fp8-10-len2048-step10",
        LAMBDA_8B_FP8_2048,
        "vLLM 0.6.0, neuralmagic/Meta-Llama-3.1-8B-FP8, --max-model-len 2048",
        "llama-3.1-8b",
        "fp8",
        6.018531635219421,
        "50.3",
        outputs=(120, 1, 1, 194, 0, 40, 0, 0, 6, 80),
        max_model_len=2048,
    ),
    _lambda_step10(
        "lambda-h100-70b-fp8-tp1-10-len2048-step10",
        LAMBDA_70B_FP8_TP1_2048,
        "vLLM 0.6.0, neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8 on one H100, --max-model-len 2048",
        "llama-3.1-70b",
        "fp8",
        35.972164704758974,
        "310.8",
        outputs=(120, 655, 92, 194, 101, 741, 0, 0, 6, 78),
        max_model_len=2048,
    ),
    *(
        wmx_l4(c, tok_s, ttft, itl, held_out=True, why=", as in round 3", c1=WMX_C1_TTFT_P50)
        for c, tok_s, ttft, itl in (
            (2, 367.0, 37.8, 5.2),
            (4, 698.0, 50.1, 5.3),
            (16, 2277.0, 103.8, 6.0),
        )
    ),
    tt_4090(
        "tt-4090-qwen3-4b-128in-1024out-c1",
        128,
        1024,
        4,
        24.7,
        10.4,
        held_out=True,
        why="; vLLM V1 assumed, as in round 3",
    ),
)

# Every point of rounds 1-3 is a fit point (all had been seen); round 4's are held out.
CASES: tuple[Case, ...] = FIT + ROUND3 + ROUND4_HELD_OUT
