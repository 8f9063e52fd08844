"""Load generator for the six request classes, with client-side measurements.

``vllm-obs load`` drives a seeded, mixed workload at an OpenAI-compatible server
and writes one JSONL record per request; ``vllm-obs load check`` joins those
records with the sidecar's events. The pieces, from pure to I/O:

- :mod:`~obs.loadgen.mix`: the workload mix (YAML -> typed model),
- :mod:`~obs.loadgen.plan`: seeded arrivals and request shapes (pure),
- :mod:`~obs.loadgen.prompts`: synthetic text of a planned token length,
- :mod:`~obs.loadgen.driver`: the aiohttp client that sends and measures,
- :mod:`~obs.loadgen.records`, :mod:`~obs.loadgen.summary`, :mod:`~obs.loadgen.check`.

The names below are importable from ``obs.loadgen`` directly; each is loaded on
first use, so ``import obs.loadgen`` stays cheap for the CLI. The functions
``plan`` and ``check`` share their module's name, so import them from
``obs.loadgen.plan`` and ``obs.loadgen.check``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from obs.loadgen.check import CheckReport, check_files
    from obs.loadgen.driver import Driver, DriverSettings, RunResult, run_load
    from obs.loadgen.mix import CLASS_NAMES, Mix, load_mix, parse_mix
    from obs.loadgen.plan import Arrivals, Burst, PlannedRequest, iter_plan
    from obs.loadgen.prompts import CharEstimate, HFTokenizer, PromptBuilder
    from obs.loadgen.records import Record, RecordWriter, read_records
    from obs.loadgen.summary import SummaryBuilder, render_table

_EXPORTS = {
    "CheckReport": "check",
    "check_files": "check",
    "Driver": "driver",
    "DriverSettings": "driver",
    "RunResult": "driver",
    "run_load": "driver",
    "CLASS_NAMES": "mix",
    "Mix": "mix",
    "load_mix": "mix",
    "parse_mix": "mix",
    "Arrivals": "plan",
    "Burst": "plan",
    "PlannedRequest": "plan",
    "iter_plan": "plan",
    "CharEstimate": "prompts",
    "HFTokenizer": "prompts",
    "PromptBuilder": "prompts",
    "Record": "records",
    "RecordWriter": "records",
    "read_records": "records",
    "SummaryBuilder": "summary",
    "render_table": "summary",
}

__all__ = [
    "CLASS_NAMES",
    "Arrivals",
    "Burst",
    "CharEstimate",
    "CheckReport",
    "Driver",
    "DriverSettings",
    "HFTokenizer",
    "Mix",
    "PlannedRequest",
    "PromptBuilder",
    "Record",
    "RecordWriter",
    "RunResult",
    "SummaryBuilder",
    "check_files",
    "iter_plan",
    "load_mix",
    "parse_mix",
    "read_records",
    "render_table",
    "run_load",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'obs.loadgen' has no attribute {name!r}")
    return getattr(importlib.import_module(f"obs.loadgen.{module}"), name)
