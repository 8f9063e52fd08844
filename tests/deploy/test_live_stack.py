"""End to end: generated rules and dashboards in a real Prometheus and Alertmanager that watch a
real sidecar in front of real vLLM pools under mixed load.

The stack and its scenario are in ``tests/support/live_stack.py``: it runs once per module (about a
minute and a half), then each test checks one promise against what really happened.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from obs import conventions as c
from obs.cli import main
from obs.dashboards import all_queries
from obs.demo.workload import CLASSES, load_demo_mix, write_mix
from obs.engines.server import VllmServer
from obs.loadgen.plan import Arrivals, bounded, iter_plan
from obs.prom.api import QueryError
from tests.conftest import TracedEngine, require_binary
from tests.support.live_stack import (
    LIMITED,
    LOAD_DURATION_S,
    LOAD_RATE,
    LOAD_SEED,
    SCRAPE_S,
    LiveStack,
)
from tests.support.probes import wait_for

F = TypeVar("F", bound=Callable[..., Any])
OPERATIONAL = ("vllm-obs-overview", "vllm-obs-lane", "vllm-obs-pools", "vllm-obs-admission")
# Panels whose signal this stack cannot make, shown absent rather than as zero: no lane is split
# and no fallback fires, the load asks for no JSON answers, and a CPU vLLM has no GPU, no
# speculative decoding and no LoRA adapters.
ABSENT_HERE = {
    "vllm-obs-lane / Requests per arm, and fallbacks",
    "vllm-obs-lane / Invalid JSON answers by model",
    "vllm-obs-pools / Speculative decoding: acceptance and draft length",
    "vllm-obs-pools / LoRA adapters running and waiting",
    "vllm-obs-pools / GPU utilisation",
    "vllm-obs-pools / GPU memory used",
    "vllm-obs-pools / GPU power",
    # No replica comes back in this run (the stopped bulk pool stays stopped; both pools were
    # healthy before the sidecar's first poll), so no cold start is measured.
    "vllm-obs-pools / Cold start: seconds to healthy and to first token",
    "vllm-obs-pools / Replicas coming back",
    # The bulk pool's engine is stopped during the run and its engine gauges are then absent
    # (an engine that reports nothing is no 0): this instant query at the end finds none.
    "vllm-obs-overview / Pool bulk: queue",
}
PNG = b"\x89PNG\r\n\x1a\n"


def live(test: F) -> F:
    """Marks of a test that needs the live stack: real engines, Prometheus, and time; it ends
    the session's traced engine (the bulk pool), so it runs after every test that uses that."""
    marked: F = pytest.mark.engine(test)
    ending: F = pytest.mark.ends_engine("traced")(marked)
    return ending


@pytest.fixture(scope="module")
def stack(
    vllm: VllmServer, traced_engine: TracedEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveStack]:
    """The stack after its scenario has run; everything it started is stopped afterwards, and
    the traced engine it took as its bulk pool (a vLLM start saved) stays stopped."""
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    root = tmp_path_factory.mktemp("live-stack")
    s = LiveStack(root, vllm, traced_engine.vllm, traced_engine.span_port)
    try:
        s.start().run()
        yield s
    finally:
        s.close()


def _rules(stack: LiveStack) -> list[tuple[str, dict[str, Any]]]:
    """(file name, rule) for every rule the stack's Prometheus loaded."""
    out = []
    for path in sorted(stack.rules_dir.glob("*.yml")):
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            out += [(path.name, rule) for rule in group["rules"]]
    return out


def _query(stack: LiveStack, expr: str) -> list[dict[str, Any]]:
    assert stack.prometheus is not None
    return stack.prometheus.client.query(expr)


def test_load_plan_sends_every_class_twice_seconds_apart(tmp_path: Path) -> None:
    """The live load (seed, rate, duration) sends each class twice, scrapes apart: rates exist."""
    mix = load_demo_mix(write_mix(tmp_path / "mix.yaml", full_mix=False), ())
    plan = bounded(iter_plan(mix, LOAD_SEED, Arrivals(rate=LOAD_RATE)), duration_s=LOAD_DURATION_S)
    offsets: dict[str, list[float]] = defaultdict(list)
    for r in plan:
        offsets[r.client_class].append(r.offset_s)
    for cls in CLASSES:
        assert len(offsets[cls]) >= 2, (cls, offsets[cls])
        assert max(offsets[cls]) - min(offsets[cls]) >= 2 * SCRAPE_S, (cls, offsets[cls])


@live
def test_prometheus_scraped_the_sidecar_and_both_pools_under_mixed_load(stack: LiveStack) -> None:
    """Every lane served requests through the sidecar while Prometheus scraped all three."""
    assert stack.sidecar is not None
    ok: dict[str, int] = defaultdict(int)
    for event in stack.sidecar.events():
        ok[event["lane"]] += event["status"] == c.OK
    assert all(ok[lane] >= 2 for lane in CLASSES), (dict(ok), stack.load_output[-2000:])
    window = f"{int(stack.finished - stack.started) + 10}s"
    up = {
        (s["metric"]["job"], s["metric"].get("pool", "")): float(s["value"][1])
        for s in _query(stack, f"max_over_time(up[{window}])")
    }
    assert up == {
        ("vllm-obs-sidecar", ""): 1.0,
        ("vllm", "interactive"): 1.0,
        ("vllm", "bulk"): 1.0,
    }


@live
def test_every_recording_rule_produces_values(stack: LiveStack) -> None:
    """Each recording rule (per lane, SLO and window; pool and lane ratios) has a sample; a
    lane's TPOT rules once one of its requests had a TPOT."""
    assert stack.prometheus is not None and stack.sidecar is not None
    count, failing = stack.prometheus.rule_health()
    assert count == len(_rules(stack)) and not failing, failing
    # TPOT is recorded only where the stream's cadence was seen (obs.record.tpot_ns: not when
    # most tokens came in the first read, as from a CPU engine that fell behind): a lane whose
    # requests all came in bursts has no TPOT series, so no TPOT rule of it has an input.
    timed = {ev["lane"] for ev in stack.sidecar.events() if ev.get("tpot_ms") is not None}
    assert len(timed) >= 2, timed  # lanes saw a cadence: some TPOT rules are checked
    missing = []
    for name, rule in _rules(stack):
        labels = rule.get("labels", {})
        if "record" not in rule or (
            labels.get("slo") == "tpot" and labels.get("lane") not in timed
        ):
            continue
        selector = ",".join(f'{k}="{v}"' for k, v in labels.items())
        if not _query(stack, f"{rule['record']}{{{selector}}}"):
            missing.append(f"{name}: {rule['record']}{{{selector}}}")
    assert not missing, "no value:\n" + "\n".join(missing) + "\n" + _scrapes(stack)


def _scrapes(stack: LiveStack) -> str:
    """How the scrapes of the sidecar and the pools went over the run: per job, the scrapes,
    how many were up and the slowest (a list per instance)."""
    window = f"{int(stack.finished - stack.started) + 10}s"
    out = []
    for job in ("vllm-obs-sidecar", "vllm"):
        sel = f'{{job="{job}"}}[{window}]'
        n, up, slow = (
            [float(r["value"][1]) for r in _query(stack, f"{fn}({m}{sel})")]
            for fn, m in (
                ("count_over_time", "up"),
                ("sum_over_time", "up"),
                ("max_over_time", "scrape_duration_seconds"),
            )
        )
        out.append(f"{job}: scrapes {n}, up {up}, slowest {slow} s")
    return "\n".join(out)


@live
def test_every_rule_and_panel_expression_runs_without_error(stack: LiveStack) -> None:
    """Every rule expression and every panel query of all five dashboards is valid PromQL."""
    assert stack.config is not None
    exprs = [(f"{name}: {r.get('record') or r['alert']}", r["expr"]) for name, r in _rules(stack)]
    exprs += [(f"{q.uid} / {q.panel}", q.expr) for q in all_queries(stack.config)]
    failed = []
    for where, expr in exprs:
        try:
            _query(stack, expr)
        except QueryError as e:
            failed.append(f"{where}: {e}")
    assert len(exprs) > 150 and not failed, "\n".join(failed)


@live
def test_every_panel_of_the_operational_dashboards_returns_data(stack: LiveStack) -> None:
    """Overview, lane, pools and admission: each panel has a target that returns a sample, but
    for the panels of signals a CPU stack without splits or JSON requests cannot make."""
    assert stack.config is not None
    window = f"{int(stack.finished - stack.started) + 10}s"
    has_data: dict[tuple[str, str], bool] = {}
    for q in all_queries(stack.config, values={"__range": window}):
        if q.uid in OPERATIONAL:
            key = (q.uid, q.panel)
            has_data[key] = has_data.get(key, False) or bool(_query(stack, q.expr))
    assert {uid for uid, _ in has_data} == set(OPERATIONAL)
    empty = {f"{uid} / {panel}" for (uid, panel), ok in has_data.items() if not ok}
    assert {f"{uid} / {panel}" for uid, panel in has_data} >= ABSENT_HERE  # the titles hold
    assert not empty - ABSENT_HERE, "no data:\n" + "\n".join(sorted(empty - ABSENT_HERE))


@live
def test_tiny_kv_cache_under_long_prompts_fires_kv_alert_to_alertmanager(
    stack: LiveStack,
) -> None:
    """A 4096-token KV cache kept full by long requests: the KV alert fires, the webhook gets it."""
    assert stack.bulk is not None
    sent = stack.notified(c.ALERT_KV_CACHE_USAGE_HIGH, pool="bulk")
    assert sent, (stack.kv_requests, stack.notes)
    assert sent[0].labels["severity"] == "ticket"
    assert sent[0].labels["replica"] == stack.bulk.url
    assert sent[0].annotations["runbook_url"].endswith("#vllmobskvcacheusagehigh")
    assert stack.fired(c.ALERT_KV_CACHE_USAGE_HIGH, pool="bulk")
    assert not stack.notified(c.ALERT_KV_CACHE_USAGE_HIGH, pool="interactive")


@live
def test_admission_past_its_bounds_fires_rejection_alert_to_alertmanager(
    stack: LiveStack,
) -> None:
    """Concurrent requests at a 1-slot, no-queue lane: 429s, then the rejection alert fires."""
    rejected = [r for r in stack.admission if r.status == 429]
    assert rejected and all(r.retry_after for r in rejected), stack.admission
    labels = {"lane": LIMITED, "pool": "interactive", "reason": c.QUEUE_FULL}
    sent = stack.notified(c.ALERT_ADMISSION_REJECTIONS_HIGH, **labels)
    assert sent, stack.notes
    assert sent[0].labels["severity"] == "ticket"
    assert stack.fired(c.ALERT_ADMISSION_REJECTIONS_HIGH, lane=LIMITED)


@live
def test_stopped_pool_fires_pool_down_page_to_alertmanager(stack: LiveStack) -> None:
    """The bulk pool's engine stopped: its lanes get 5xx answers and the pool-down page fires."""
    # 503 when the port refuses; on a busy machine another process may take the freed port
    # meanwhile, and the lane's timeout answers 504.
    assert all(r.status in (503, 504) for r in stack.after_stop), stack.after_stop
    sent = stack.notified(c.ALERT_POOL_DOWN, pool="bulk")
    assert sent, stack.notes
    assert sent[0].labels["severity"] == "page"
    assert stack.fired(c.ALERT_POOL_DOWN, pool="bulk")
    # No check that the interactive pool stayed quiet: with `for: 0s`, one /metrics poll that
    # a starved engine answers after the poll timeout (1 s here) reads as "down", and does on
    # this 2-core machine under load. Production holds (2m) absorb that.


@live
def test_render_draws_every_dashboard_from_the_run(
    stack: LiveStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``vllm-obs dashboards render`` draws each dashboard over the run, every panel with data."""
    assert stack.prometheus is not None
    out = tmp_path / "img"
    render = [
        "dashboards", "--config", str(stack.lanes_path), "render",
        "--prometheus", stack.prometheus.url, "--out", str(out),
        "--start", _iso(stack.started), "--end", _iso(stack.finished),
        "--step", "1", "--rate-interval", "15s",
    ]  # fmt: skip
    assert main(render) == 0
    every = capsys.readouterr()
    # The lane drill-down opens on the default lane (chat), which had no upstream errors;
    # long-prefill, whose pool was stopped, fills every panel.
    assert main([*render, "--dashboard", "lane", "--lane", "long-prefill"]) == 0
    lane = capsys.readouterr()
    assert not every.err and not lane.err, every.err + lane.err
    for name in ("overview", "lane", "pools", "admission", "slo"):
        png = out / f"dashboard-{name}.png"
        assert png.read_bytes()[:8] == PNG and png.stat().st_size > 20_000
    lines = every.out.splitlines() + lane.out.splitlines()
    for name in ("overview", "pools", "admission", "lane"):
        line = [x for x in lines if f"dashboard-{name}.png: " in x][-1]
        absent = {t.split(" / ", 1)[1] for t in ABSENT_HERE if t.startswith(f"vllm-obs-{name} ")}
        empty = line.partition(" without data")[2].strip(" ()")
        assert line.endswith(" 0 without data") or set(empty.split("; ")) <= absent, line


def _iso(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).isoformat()


@live
def test_latency_exemplars_in_prometheus_are_traces_the_sidecar_exported(stack: LiveStack) -> None:
    """/metrics answers OpenMetrics with trace-id exemplars; Prometheus stores them for TTFT,
    TPOT and end-to-end, and every trace id it returns is one of the exported traces."""
    assert stack.prometheus is not None and stack.sidecar is not None
    accept = {"accept": "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"}
    page = httpx.get(stack.sidecar.url + "/metrics", headers=accept, timeout=10)
    assert page.headers["content-type"].startswith("application/openmetrics-text")
    assert f'# {{{c.EXEMPLAR_TRACE_ID}="' in page.text
    exported = {s.trace_id for s in stack.otlp.spans}
    for metric in c.EXEMPLAR_METRICS:
        found = stack.prometheus.client.exemplars(
            f"{metric.name}_bucket", stack.started - 60, time.time()
        )
        ids = {e["labels"][c.EXEMPLAR_TRACE_ID] for series in found for e in series["exemplars"]}
        assert ids, f"no exemplar of {metric.name}"
        assert ids <= exported, (metric.name, sorted(ids - exported)[:3])


@live
def test_genai_metrics_and_event_log_records_reach_the_otlp_receiver(stack: LiveStack) -> None:
    """gen_ai.server.time_to_first_token arrives over OTLP; each event arrives as a log record
    carrying its request's trace id."""
    assert stack.sidecar is not None
    ttft = stack.otlp.points_of(c.GENAI_TIME_TO_FIRST_TOKEN.name)
    assert ttft and max(p.count for p in ttft) > 0
    assert ttft[-1].explicit_bounds == list(c.GENAI_TIME_TO_FIRST_TOKEN.buckets)
    events = {e["request_id"]: e["trace_id"] for e in stack.sidecar.events()}

    def logged() -> dict[str, str]:
        got = {r.attributes["request_id"]: r.trace_id for r in stack.otlp.logs}
        return got if set(events) <= set(got) else {}

    got = wait_for("every event as a log record", logged, timeout_s=20)
    assert events and all(got[rid] == trace for rid, trace in events.items() if trace)
