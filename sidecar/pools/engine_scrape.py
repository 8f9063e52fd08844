"""Reading a replica's ``/metrics`` page into the engine-neutral pool state.

The exposition is parsed with ``prometheus_client``'s text parser (the format's
reference implementation in Python). A vLLM page is ~55 kB, mostly histograms
the sidecar does not read, and parsing all of it costs ~13 ms of event-loop time
per replica and poll; so the page is first cut down to the lines of the metric
families the engine's adapter wants (a ``str.startswith`` per line), and only
those are parsed. The adapter (``obs.engines``) maps the sums to an
:class:`~obs.engines.metrics.EngineState`.
"""

from __future__ import annotations

from dataclasses import replace

from prometheus_client.parser import text_string_to_metric_families

from obs.engines.adapters import ADAPTERS, AUTO, Adapter, unknown_state
from obs.engines.metrics import EngineState, Sums
from obs.served import VLLM_CACHE_CONFIG, vllm_cache_settings


class ExpositionError(ValueError):
    """The page is not in the Prometheus text format."""


def detect_page(text: str) -> Adapter | None:
    """The adapter whose metric prefix starts the most lines of the page, or ``None``."""
    counts = {a.name: text.count("\n" + a.prefix) + text.startswith(a.prefix) for a in _ALL}
    best = max(counts, key=counts.__getitem__)
    return ADAPTERS[best] if counts[best] else None


def wanted_lines(text: str, wants: tuple[str, ...]) -> str:
    """The sample, ``# HELP`` and ``# TYPE`` lines of the families named in ``wants``."""
    starts = (*wants, *(f"# HELP {w}" for w in wants), *(f"# TYPE {w}" for w in wants))
    return "\n".join(line for line in text.splitlines() if line.startswith(starts)) + "\n"


def parse_sums(text: str) -> Sums:
    """Each sample name's sum over its label sets; raises :class:`ExpositionError`."""
    try:
        return Sums.of(
            (sample.name, sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        )
    except (ValueError, IndexError, TypeError) as e:
        raise ExpositionError(f"unreadable /metrics page: {e}") from e


def read_state(engine: str, text: str) -> EngineState:
    """The replica's state from its ``/metrics`` page, by the pool's engine (or ``auto``)."""
    adapter = detect_page(text) if engine == AUTO else ADAPTERS[engine]
    if adapter is None:
        return unknown_state()
    lines = wanted_lines(text, _wants(adapter))
    return replace(adapter.state(parse_sums(lines)), models=model_names(lines))


def page_settings(engine: str, text: str) -> dict[str, str]:
    """The settings a replica's ``/metrics`` page states (vLLM's ``cache_config_info``)."""
    if engine not in ("vllm", "sim"):  # the simulator states vLLM's cache_config_info
        return {}
    lines = wanted_lines(text, (VLLM_CACHE_CONFIG,))
    try:
        for family in text_string_to_metric_families(lines):
            for sample in family.samples:
                return vllm_cache_settings(sample.labels)  # one engine core speaks for all
    except (ValueError, IndexError, TypeError):
        return {}
    return {}


def model_names(lines: str) -> tuple[str, ...]:
    """The ``model_name`` label values of the samples (at most ``MAX_MODELS``): the models the
    replica serves, the only ones that become metric labels (see obs.sidecar.pools.pools)."""
    models: dict[str, None] = {}
    at = lines.find(_MODEL)
    while at >= 0 and len(models) < MAX_MODELS:
        start = at + len(_MODEL)
        end = lines.find('"', start)
        if end < 0:
            break
        models.setdefault(lines[start:end])
        at = lines.find(_MODEL, end)
    return tuple(models)


def _wants(adapter: Adapter) -> tuple[str, ...]:
    # A counter's family is named without ``_total``; its TYPE line must still match.
    return tuple({*adapter.wants, *(w.removesuffix("_total") for w in adapter.wants)})


_ALL = tuple(ADAPTERS.values())
_MODEL = 'model_name="'
MAX_MODELS = 8  # model names taken from one replica's page
