"""Helpers the tests share (one copy each): request bodies, reference statistics, JSON walks.

Fixtures live in ``conftest.py`` (``mixed_log`` among them); free ports come from
``obs.procs.free_port``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from obs.sidecar.testing import SidecarProcess

MODEL = "tiny"  # the served model name of the engine fixtures

# ``--set`` options for ``vllm-obs demo``, ``sweep`` and ``load``: the shipped plan (classes,
# arrivals, sessions) with the requests that outlive the load cut short, so its drain takes
# seconds, not ten: agent turns 0.1-0.3 s apart, slow streams and batch answers of 16-32 tokens.
QUICK_DRAIN = (
    *("--set", "agent.think_time_s=[0.1, 0.3]"),
    *("--set", "slow-stream.max_tokens=[16, 32]"),
    *("--set", "batch.max_tokens=[16, 32]"),
)


def chat_body(text: str = "hi", max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    """A chat completions request for the tiny model: one user message, then ``extra``."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        **extra,
    }


def chat_answer(text: str, model: str = MODEL) -> dict[str, Any]:
    """A whole (non-streamed) chat completion of one token, as an OpenAI-compatible server
    answers it: what the fake pools of the tests send back."""
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def pct(values: list[float], q: float) -> float | None:
    """Reference percentile: linear interpolation between the closest ranks (None if empty)."""
    v = sorted(values)
    if not v:
        return None
    h = (len(v) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (h - lo) * (v[hi] - v[lo])


def strings(obj: object) -> Iterator[str]:
    """Every string value in a JSON-like tree (dict values and list items, depth first)."""
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from strings(v)


def event_of(sc: SidecarProcess, request_id: str) -> dict[str, Any]:
    """The event of ``request_id``, waiting up to 10 s for it to be on disk."""
    mine = sc.events_of(request_id)
    assert mine, f"no event for {request_id}"
    return mine[0]
