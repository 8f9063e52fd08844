"""Per model, per engine feature and per GPU: TTFT p95 and tokens/s by model,
speculative-decoding acceptance and draft length, the LoRA adapters running and waiting (vLLM's
own metrics), and GPU utilisation, memory and power (NVIDIA's dcgm-exporter).

Each query reads only what vLLM exports; an engine without speculative decoding or LoRA
exports none of those series, and its panels show no data (absent), never a zero.
"""

from __future__ import annotations

from obs import conventions as c

from . import expr as e
from .panels import Grid, Query, timeseries

MODEL = "model_name"  # vLLM labels its metrics model_name
# dcgm-exporter's host label: Hostname up to its release 4.5.3-4.8.2, hostname after (its commit
# d5e5f51, #655), as the GPU rules group (alerts/gpu_rules.py GPU). Grouped by both, a pod keeps
# its host (the other is empty) whichever release is scraped; the legend shows the one set.
HOST = ("Hostname", "hostname")


def models_row(grid: Grid) -> None:
    """A row of the pools dashboard: models, speculative decoding, LoRA."""
    grid.row("Models, speculative decoding and LoRA (vLLM's own metrics)")
    scope = (e.POOL_VAR, e.VLLM_MODEL_VAR)
    ttft = e.selector(f"{c.VLLM_TTFT}_bucket", *scope)
    grid.add(
        timeseries(
            "TTFT p95 by model",
            [Query(e.quantile(0.95, ttft, MODEL), "{{model_name}}")],
            unit="s",
            description="The engine's time to first token, 95th percentile, per served model.",
        ),
        12,
        8,
    )
    tokens = [
        Query(e.sum_by(e.rate(e.selector(name, *scope)), MODEL), f"{{{{model_name}}}} {kind}")
        for name, kind in (
            (c.VLLM_PROMPT_TOKENS, "prompt"),
            (c.VLLM_GENERATION_TOKENS, "generated"),
        )
    ]
    grid.add(
        timeseries(
            "Tokens/s by model",
            tokens,
            unit="short",
            description="Prompt and generated tokens per second, per served model.",
        ),
        12,
        8,
    )

    def spec(name: str) -> str:
        return e.sum_by(e.rate(e.selector(name, e.POOL_VAR)), c.POOL)

    grid.add(
        timeseries(
            "Speculative decoding: acceptance and draft length",
            [
                Query(
                    e.ratio(spec(c.VLLM_SPEC_ACCEPTED), spec(c.VLLM_SPEC_DRAFT_TOKENS) + " > 0"),
                    "{{pool}} accepted share",
                ),
                Query(
                    e.ratio(spec(c.VLLM_SPEC_DRAFT_TOKENS), spec(c.VLLM_SPEC_DRAFTS) + " > 0"),
                    "{{pool}} draft tokens per step",
                ),
            ],
            unit="short",
            description=(
                "Accepted draft tokens over proposed ones, and draft tokens per drafting step "
                "(vllm:spec_decode_*). No series: the pool runs no speculative decoding."
            ),
        ),
        12,
        8,
    )
    lora = e.selector(c.VLLM_LORA_INFO, e.POOL_VAR)
    grid.add(
        timeseries(
            "LoRA adapters running and waiting",
            [
                Query(
                    f"count by (pool, running_lora_adapters, waiting_lora_adapters) ({lora})",
                    "{{pool}} running [{{running_lora_adapters}}] waiting "
                    "[{{waiting_lora_adapters}}]",
                )
            ],
            unit="short",
            description=(
                "Replicas per set of adapters running and waiting (the vllm:lora_requests_info "
                "labels). No series: the pool serves no LoRA adapters."
            ),
        ),
        12,
        8,
    )


def gpus_row(grid: Grid) -> None:
    """GPU utilisation, memory and power from NVIDIA's dcgm-exporter, per pod and host."""
    grid.row("GPUs (NVIDIA dcgm-exporter)")
    by = (*HOST, "pod")
    legend = "".join(f"{{{{{h}}}}}" for h in HOST) + " {{pod}}"
    used, free = c.DCGM_FB_USED, c.DCGM_FB_FREE
    for title, expr, unit, what in (
        (
            "GPU utilisation",
            e.agg("avg", f"{c.DCGM_GPU_UTIL} / 100", *by),
            "percentunit",
            "Share of time the GPUs of each pod were busy (the guides aim at 70-95% under load).",
        ),
        (
            "GPU memory used",
            e.ratio(e.agg("sum", used, *by), e.agg("sum", f"{used} + {free}", *by)),
            "percentunit",
            "Frame buffer used over total; vLLM takes --gpu-memory-utilization of it at start.",
        ),
        (
            "GPU power",
            e.agg("sum", c.DCGM_POWER, *by),
            "watt",
            "Power drawn by the GPUs of each pod.",
        ),
    ):
        grid.add(
            timeseries(
                title,
                [Query(expr, legend)],
                unit=unit,
                description=(
                    f"{what} Keyed by the pod (and host) that runs the replica, as dcgm-exporter "
                    "labels it; no series without a dcgm-exporter scraped."
                ),
            ),
            8,
            8,
        )
