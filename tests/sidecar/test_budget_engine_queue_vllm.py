"""A saturated pool's misses without the engine's spans, on a real vLLM: the engine's queue is
told apart from prefill by the pool's state at dispatch (``engine_view: inferred``), and the
misses are charged to it, not to ``other`` (#40's bar). Then, on the same engine tracing to a
second sidecar, the estimate measured against vLLM's own spans.

The engine has room for 2 sequences (``--max-num-seqs 2``) and 16 clients stream at once,
each a few requests of 160 tokens in a row, under a 300 ms TTFT SLO: most requests wait for
a slot (bench/engine_queue_share.py drives the same load and prints each miss's facts).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.engine_queue_share import (
    STREAMS,
    lanes_config,
    saturate,
    ttft_misses,
)
from obs.engine_queue import inferred_wait_ms, queued
from obs.sidecar.testing import OtlpReceiver, SidecarProcess
from tests.conftest import TracedEngine
from tests.support.lanes_support import query_budget

pytestmark = pytest.mark.engine


class Saturated:
    def __init__(self, plain: SidecarProcess, traced: SidecarProcess) -> None:
        self.plain, self.traced = plain, traced


@pytest.fixture(scope="module")
def saturated(
    two_slot_engine: TracedEngine,
    otlp_receiver: OtlpReceiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Saturated]:
    """The session's vLLM with 2 sequence slots; a sidecar without its spans, and one that
    joins them (listening where that engine sends its spans)."""
    work = tmp_path_factory.mktemp("saturated")
    vllm = two_slot_engine.vllm
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": otlp_receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    sidecars = []
    try:
        for name, traced in (("plain", False), ("traced", True)):
            sidecars.append(
                SidecarProcess(
                    config=lanes_config(work / name, vllm.url, traced),
                    events=work / name / "events.jsonl",
                    args=("--engine-join-wait", "5", "--pool-poll-interval", "1"),
                    env=env,
                    log_path=work / name / "sidecar.log",
                    port=two_slot_engine.span_port if traced else None,
                ).start()
            )
        yield Saturated(*sidecars)
    finally:
        for sc in sidecars:
            sc.stop()


def test_saturated_pool_misses_are_the_engine_queue_without_spans(saturated: Saturated) -> None:
    """No engine span, every slot taken: the wait is inferred from the pool's state at dispatch.
    Of the TTFT misses of requests that waited for a slot, at least 70% are the engine's queue
    and at most 10% other; `query budget` names the engine's queue as the top cause.

    A starved machine (the suite's other work) makes slow the requests that found a slot free
    (their prefill, 0.4 s instead of 0.05 on this CPU engine when the suite runs beside it):
    the rule leaves those as `other` unless the pool filled while they were in flight
    (``obs.engine_queue.busy_cause``), and they are not what this test judges (15-39% of all
    misses in single runs here, 21% in both runs of one suite). The sidecar's own hand-over of
    a queued request's first token, slow under such a stall, is `other` too: a run past 10% is
    run once more. A request that waited for a slot and whose queue or prefill is charged to
    `other` is the rule's fault: it fails at once."""
    sc = saturated.plain
    for _ in range(2):
        events = _saturate(sc)
        misses = ttft_misses(events)
        waited = [e for e in misses if queued(_View(e))]
        share = shares(waited)
        print(f"ttft misses {len(misses)}/{len(events)}, {len(waited)} waited; causes {share}")
        others = [e for e in waited if e["miss_cause"] == "other"]
        wrong = [e for e in others if e["miss_phase"] in ("queue", "prefill")]
        assert not wrong, wrong
        if share.get("other", 0.0) <= 0.10:
            break
    assert len(waited) >= STREAMS, share
    assert share.get("other", 0.0) <= 0.10, share
    assert share.get("engine_queue", 0.0) >= 0.70, share
    inferred = [e for e in events if e["engine_view"] == "inferred"]
    assert all(e["engine_queue_ms"] is not None for e in inferred)
    assert all(queued(_View(e)) for e in inferred)
    spent = query_budget(sc.events_path or Path())
    top = spent[("chat", "ttft")]["by_cause"][0]
    assert top["cause"] == "engine_queue", spent[("chat", "ttft")]["by_cause"]


def _saturate(sc: SidecarProcess) -> list[dict[str, Any]]:
    """The saturating load's events; run once more when a client request failed (on a starved
    machine the engine once accepted no connection within the sidecar's 2 s: a 503)."""
    try:
        return saturate(sc)
    except RuntimeError as err:
        print(f"the load is run again: {err}")
        return saturate(sc)


def shares(misses: list[dict[str, Any]]) -> dict[str, float]:
    """The share of ``misses`` charged to each cause."""
    causes = Counter(e["miss_cause"] for e in misses)
    return {c: n / len(misses) for c, n in causes.most_common()} if misses else {}


class _View:
    """An event's pool_* fields as attributes (what obs.engine_queue reads)."""

    def __init__(self, e: dict[str, Any]) -> None:
        self.__dict__.update(e)


def test_inferred_wait_against_the_engines_spans(saturated: Saturated) -> None:
    """With vLLM's spans joined, the estimate the pool's state gives (the prefill beyond the
    good requests' mean) is compared with the span's queue time for every queued request: on
    average it holds at least the span's wait (the figures are printed; docs/query.md quotes
    them)."""
    sc = saturated.traced
    events = _saturate(sc)
    joined = [e for e in events if e["engine_view"] == "joined"]
    assert len(joined) >= 0.9 * len(events), [e["engine_view"] for e in events]
    good = [e["prefill_ms"] for e in joined if not e["miss_slo"]]
    base = statistics.fmean(good) if good else 0.0
    pairs = [
        (inferred_wait_ms(e["prefill_ms"] + e["engine_queue_ms"], base), e["engine_queue_ms"])
        for e in joined
        if queued(_View(e)) and e["engine_queue_ms"] is not None
    ]
    assert len(pairs) >= STREAMS, len(pairs)
    err = [est - span for est, span in pairs]
    outside = [est for est, _ in pairs]
    print(
        f"queued {len(pairs)}/{len(joined)}: span queue mean "
        f"{statistics.fmean(s for _, s in pairs):.1f} ms, estimate mean "
        f"{statistics.fmean(outside):.1f} ms, error mean {statistics.fmean(err):.1f} ms, "
        f"mean |error| {statistics.fmean(abs(x) for x in err):.1f} ms"
    )
    # The sidecar's estimate holds the span's wait (what vLLM's scheduler saw is part of the
    # time between dispatch and the first token beyond a good request's prefill), plus the
    # API server's own hold (+170 to +260 ms on average on this CPU engine): it does not
    # miss the wait the span sees.
    span_mean = statistics.fmean(s for _, s in pairs)
    assert statistics.fmean(outside) >= 0.8 * span_mean
