"""Reads the few engine-state values the sidecar needs from a vLLM ``/metrics`` page.

A deliberately small parser of the Prometheus text format: it sums each
wanted sample name over its label sets (vLLM labels by engine and model).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from obs import conventions as c

WANTED = (
    c.VLLM_KV_CACHE_USAGE,
    c.VLLM_RUNNING,
    c.VLLM_WAITING,
    c.VLLM_PREFIX_QUERIES,
    c.VLLM_PREFIX_HITS,
    c.VLLM_PREEMPTIONS,
)


MAX_MODELS = 8  # model names taken from one replica's page


@dataclass(frozen=True, slots=True)
class EngineState:
    kv_cache_usage: float
    running: float
    waiting: float
    prefix_queries: float
    prefix_hits: float
    preemptions: float
    models: tuple[str, ...] = ()  # the model_name values the replica's samples carry


def parse_engine_state(text: str) -> EngineState:
    """Engine state from a ``/metrics`` exposition; absent samples read as 0."""
    sums = dict.fromkeys(WANTED, 0.0)
    counts = dict.fromkeys(WANTED, 0)
    models: dict[str, None] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        end = line.find("{")
        name = line[: end if end >= 0 else line.find(" ")]
        if name in sums:
            if name == c.VLLM_RUNNING and len(models) < MAX_MODELS:
                at = line.find('model_name="')
                if at >= 0:
                    start = at + len('model_name="')
                    models.setdefault(line[start : line.find('"', start)])
            try:
                value = float(
                    line.rsplit(" ", 1)[1] if "}" not in line else line.rsplit("}", 1)[1].split()[0]
                )
            except (IndexError, ValueError):
                continue
            if not math.isnan(value):
                sums[name] += value
                counts[name] += 1
    usage = sums[c.VLLM_KV_CACHE_USAGE]
    if counts[c.VLLM_KV_CACHE_USAGE] > 1:  # several engines: report their mean usage
        usage /= counts[c.VLLM_KV_CACHE_USAGE]
    return EngineState(
        kv_cache_usage=usage,
        running=sums[c.VLLM_RUNNING],
        waiting=sums[c.VLLM_WAITING],
        prefix_queries=sums[c.VLLM_PREFIX_QUERIES],
        prefix_hits=sums[c.VLLM_PREFIX_HITS],
        preemptions=sums[c.VLLM_PREEMPTIONS],
        models=tuple(models),
    )
