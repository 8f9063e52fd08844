"""`vllm_obs_slo_misses_total`: misses by lane, SLO, phase and cause, with bounded labels."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from obs import conventions as c
from obs.attribution import MissStamp
from obs.config import default_config_path, load_config
from obs.events import Event
from obs.exporters.prom import Metrics
from obs.phases import Clock
from obs.record import Finished
from obs.tracecontext import new_ids

CONFIG = load_config(default_config_path())
ms = st.floats(0, 30_000, allow_nan=False)
events = st.builds(
    Event,
    lane=st.sampled_from([*CONFIG.lane_names, "made-up"]),
    status=st.sampled_from(c.OUTCOMES),
    stream=st.booleans(),
    ttft_ms=st.none() | ms,
    tpot_ms=st.none() | st.floats(0, 1000, allow_nan=False),
    e2e_ms=ms,
    queue_ms=ms,
    prefill_ms=ms,
    first_token_ms=ms,
    decode_ms=ms,
    stream_ms=ms,
    stream_blocked_ms=ms,
    error_class=st.sampled_from([None, "upstream_connect", "slow_client", "internal", "x" * 40]),
    error_phase=st.sampled_from([None, *c.PHASES, "nonsense"]),
    prompt_tokens=st.none() | st.integers(0, 100_000),
    cache_hit=st.none() | st.booleans(),
    engine_queue_ms=st.none() | ms,
)


def _samples(registry: CollectorRegistry) -> list[dict[str, str]]:
    return [
        s.labels
        for m in registry.collect()
        if m.name == c.SLO_MISSES.name
        for s in m.samples
        if s.name.endswith("_total")
    ]


@settings(max_examples=30, deadline=None)
@given(st.lists(events, min_size=1, max_size=200))
def test_misses_counter_labels_stay_within_phases_times_causes(batch: list[Event]) -> None:
    """Whatever requests end, each lane and SLO has at most phases x causes miss series,
    every label value from the fixed enums, and one count per missed gate."""
    registry = CollectorRegistry()
    metrics, stamp = Metrics(CONFIG, registry), MissStamp(CONFIG)
    gates = 0
    for ev in batch:
        f = Finished(ev, Clock(received=1), 0, new_ids(None))
        stamp.on_end(f)
        metrics.export(f)
        gates += len(f.misses)
    samples = _samples(registry)
    per: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for s in samples:
        assert s[c.LANE] in CONFIG.lane_names
        assert s[c.SLO_LABEL] in c.SLO_KINDS
        assert s[c.PHASE] in c.PHASES and s[c.CAUSE] in c.MISS_CAUSES
        per.setdefault((s[c.LANE], s[c.SLO_LABEL]), set()).add((s[c.PHASE], s[c.CAUSE]))
    assert all(len(v) <= len(c.PHASES) * len(c.MISS_CAUSES) for v in per.values())
    total = sum(
        s.value
        for m in registry.collect()
        if m.name == c.SLO_MISSES.name
        for s in m.samples
        if s.name.endswith("_total")
    )
    assert total == gates


def test_unknown_label_values_are_counted_as_other() -> None:
    """A miss named outside the enums (a record from elsewhere) is counted under `other`."""
    registry = CollectorRegistry()
    metrics = Metrics(CONFIG, registry)
    f = Finished(Event(lane="chat"), Clock(received=1), 0, new_ids(None))
    f.misses = (("ttft", "warp", "cosmic_rays"),)
    metrics.export(f)
    (labels,) = _samples(registry)
    assert labels == {c.LANE: "chat", c.SLO_LABEL: "ttft", c.PHASE: "other", c.CAUSE: "other"}
