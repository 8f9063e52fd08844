"""The engines' own metric names that the adapters read or the dashboards query."""

from __future__ import annotations

from typing import Final

# vLLM's own metrics (as of 0.32) that the sidecar reads or the dashboards query.
VLLM_KV_CACHE_USAGE: Final = "vllm:kv_cache_usage_perc"
VLLM_RUNNING: Final = "vllm:num_requests_running"
VLLM_WAITING: Final = "vllm:num_requests_waiting"
VLLM_PREFIX_QUERIES: Final = "vllm:prefix_cache_queries_total"
VLLM_PREFIX_HITS: Final = "vllm:prefix_cache_hits_total"
VLLM_PREEMPTIONS: Final = "vllm:num_preemptions_total"
VLLM_QUEUE_TIME: Final = "vllm:request_queue_time_seconds"
VLLM_PREFILL_TIME: Final = "vllm:request_prefill_time_seconds"
VLLM_DECODE_TIME: Final = "vllm:request_decode_time_seconds"
VLLM_TTFT: Final = "vllm:time_to_first_token_seconds"
VLLM_ITL: Final = "vllm:inter_token_latency_seconds"
VLLM_PROMPT_TOKENS: Final = "vllm:prompt_tokens_total"
VLLM_GENERATION_TOKENS: Final = "vllm:generation_tokens_total"
# Speculative decoding (only with --speculative-config) and LoRA (only with --enable-lora):
# absent otherwise, and the panels then show no series rather than a zero.
VLLM_SPEC_DRAFTS: Final = "vllm:spec_decode_num_drafts_total"
VLLM_SPEC_DRAFT_TOKENS: Final = "vllm:spec_decode_num_draft_tokens_total"
VLLM_SPEC_ACCEPTED: Final = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_LORA_INFO: Final = "vllm:lora_requests_info"  # labels running/waiting_lora_adapters
VLLM_METRICS: Final = (
    VLLM_KV_CACHE_USAGE,
    VLLM_RUNNING,
    VLLM_WAITING,
    VLLM_PREFIX_QUERIES,
    VLLM_PREFIX_HITS,
    VLLM_PREEMPTIONS,
    VLLM_QUEUE_TIME,
    VLLM_PREFILL_TIME,
    VLLM_DECODE_TIME,
    VLLM_TTFT,
    VLLM_ITL,
    VLLM_PROMPT_TOKENS,
    VLLM_GENERATION_TOKENS,
    VLLM_SPEC_DRAFTS,
    VLLM_SPEC_DRAFT_TOKENS,
    VLLM_SPEC_ACCEPTED,
    VLLM_LORA_INFO,
)

# NVIDIA's dcgm-exporter, default counters (its default-counters.csv): per GPU, labelled
# gpu, UUID, device, modelName, Hostname, and pod/namespace/container under Kubernetes.
DCGM_GPU_UTIL: Final = "DCGM_FI_DEV_GPU_UTIL"  # percent
DCGM_FB_USED: Final = "DCGM_FI_DEV_FB_USED"  # MiB
DCGM_FB_FREE: Final = "DCGM_FI_DEV_FB_FREE"  # MiB
DCGM_POWER: Final = "DCGM_FI_DEV_POWER_USAGE"  # W
DCGM_METRICS: Final = (DCGM_GPU_UTIL, DCGM_FB_USED, DCGM_FB_FREE, DCGM_POWER)

# Other engines' own metrics that their adapters read (see obs.engines.adapters): SGLang's
# python/sglang/srt/metrics/collector.py, llama.cpp's tools/server/server-task.cpp
# (served with --metrics), TGI's router/src/server.rs and backends/v3/src.
SGLANG_TOKEN_USAGE: Final = "sglang:token_usage"
SGLANG_RUNNING: Final = "sglang:num_running_reqs"
SGLANG_WAITING: Final = "sglang:num_queue_reqs"
SGLANG_PROMPT_TOKENS: Final = "sglang:prompt_tokens_total"
SGLANG_CACHED_TOKENS: Final = "sglang:cached_tokens_total"
LLAMACPP_PROCESSING: Final = "llamacpp:requests_processing"
LLAMACPP_DEFERRED: Final = "llamacpp:requests_deferred"
LLAMACPP_PROMPT_TOKENS: Final = "llamacpp:prompt_tokens_total"
LLAMACPP_CACHED_TOKENS: Final = "llamacpp:prompt_tokens_cached_total"
TGI_BATCH_SIZE: Final = "tgi_batch_current_size"
TGI_QUEUE_SIZE: Final = "tgi_queue_size"
