"""The simulated vLLM replica (``vllm-obs engine sim``): vLLM's own names, marked ``sim``.

Its ``/metrics`` page is vLLM V1's, so the mapping is vLLM's; only the engine name
differs, so that a simulated pool is never mistaken for a real one: its pool state,
``vllm_obs_pool_engine_info`` and the settings fingerprint every event carries say
``sim``. ``engine: auto`` cannot tell the two apart (same prefix) and reads ``vllm``:
configure a simulated pool with ``engine: sim``.
"""

from __future__ import annotations

from dataclasses import replace

from obs.engines.adapters.base import ENGINE_VIEW_FIELDS
from obs.engines.adapters.vllm import VLLM, read_v1
from obs.engines.metrics import EngineState, Sums


def _read(s: Sums) -> EngineState:
    return read_v1(s, "sim")


SIM = replace(
    VLLM,
    name="sim",
    read=_read,
    serve_flags="`vllm-obs engine sim` with the pool's vLLM flags; spans: "
    "--otlp-traces-endpoint http://SIDECAR:8000/v1/traces",
    events={
        "engine_view": "joined when the pool traces to the sidecar (`engine_traces: true`)",
        "cached_tokens": "null (no prompt tokens details)",
        "error_message": "`error.message` of its error body",
        "cache_hit": "null (no prompt tokens details)",
        **dict.fromkeys(
            ENGINE_VIEW_FIELDS, "with `--otlp-traces-endpoint` (its llm_request span, as vLLM's)"
        ),
    },
    tested="`vllm-obs engine sim` in process (tests/engines/test_sim_server.py)",
)
