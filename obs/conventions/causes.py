"""What each cause of an SLO miss (``MISS_CAUSES``, the ``cause`` label) means, and the lever
docs/runbook.md (*Where the budget went*) names for it: the words of ``vllm-obs query
incident`` and of the demo's closing summary. The runbook's table says the same at length."""

from __future__ import annotations

from typing import Final

from obs.conventions.labels import MISS_CAUSES as _CAUSES

CAUSE_WORDS: Final[dict[str, tuple[str, str]]] = {
    "admission_queue": (
        "requests waited for a slot of the lane's admission gate",
        "raise the lane's admission.max_concurrency if the pool has headroom; else add replicas",
    ),
    "engine_queue": (
        "requests waited in the engine's own queue: the pool was saturated",
        "add replicas, or move a heavy lane to its own pool",
    ),
    "prefills_ahead": (
        "requests waited in the engine behind long prompts in flight",
        "route long prompts to their own lane and pool (min_prompt_tokens), or cap them "
        "(admission.max_prompt_tokens); partial prefills (--long-prefill-token-threshold)",
    ),
    "kv_pressure": (
        "the engine was short of KV cache (near full, or preempting)",
        "more KV cache per replica (--gpu-memory-utilization, a smaller context), fewer "
        "sequences (--max-num-seqs), or more replicas",
    ),
    "engine_slow": (
        "the engine itself computed slowly: its own prefill or decode per token far slower "
        "than the lane's good requests', with no queue or long prompts to say why",
        "the replica's host or device was slow: check GPU clocks and throttling, co-located "
        "processes, the replica's health; drain it if it is one replica",
    ),
    "long_prefill": (
        "prompts far longer than the lane's usual ones",
        "route them to a bulk lane (min_prompt_tokens) or cap them (admission.max_prompt_tokens)",
    ),
    "cache_miss": (
        "requests missed the prefix cache the lane usually hits",
        "routing: prefix_affinity; check KV usage and replica restarts",
    ),
    "slow_client": (
        "clients read slowly and the relay waited on them",
        "the client side; bound it with the lane's admission.slow_client",
    ),
    "upstream_error": (
        "the pool refused, failed or timed out",
        "see the replicas behind it (VllmObsPoolReplicaDown) and the worst misses' errors",
    ),
    "other": (
        "slower than the lane's good requests with nothing on record to say why",
        "compare the worst misses (query show) with good ones; check the replica",
    ),
}
assert set(CAUSE_WORDS) == set(_CAUSES)
