"""Every panel query runs in a real Prometheus and returns data.

Prometheus is given synthetic series for every metric the sidecar exports
(label sets as the config implies), vLLM's histograms with a ``pool`` scrape
label, and the recording rules the alerts generator writes; then each query
of ``all_queries`` is evaluated over the HTTP API. Synthetic data stands in
for a real sidecar + vLLM (which the end-to-end tests cover) because only here
can every label combination be present at once; it catches what the parser
cannot: joins that match many-to-many, selectors that match nothing.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from obs import conventions as c
from obs.config import Config, default_config_path, load_config
from obs.dashboards import all_queries
from obs.dashboards.sli import objectives
from obs.procs import free_port
from tests.conftest import require_binary

pytestmark = pytest.mark.stack

STEP_S = 15
SAMPLES = 41  # ten minutes
FIXED = {
    c.REPLICA: ["r0", "r1"],
    c.PHASE: list(c.PHASES),
    c.OUTCOME: list(c.OUTCOMES),
    c.MODEL: ["m"],
    c.FINISH_REASON: ["stop"],
    c.REASON: ["queue_full"],
    c.ERROR_CLASS: ["timeout"],
    c.EXPORTER: ["jsonl"],
    c.RESULT: ["joined", "late", c.JSON_VALID, c.JSON_INVALID],
    c.ENGINE: ["vllm"],
    c.LIMIT: ["header_timeout"],
    c.FINGERPRINT: ["0a1b2c3d"],
    c.CHANGED: ["prefix_caching"],
    c.OLD: ["prefix_caching=false"],
    c.NEW: ["prefix_caching=true"],
    c.CONFIG_HASH: ["0a1b2c3d"],
    c.CONFIG_VERSION: ["1"],
    c.STAGE: list(c.COLD_START_STAGES),
    c.ARM: ["interactive", "bulk"],  # a split lane's arms (pools of the default config)
    c.SLO_LABEL: ["ttft", "availability"],
    c.BAND: ["0", "7"],  # flow control (docs/flow.md)
    c.GATE: ["waiting"],
    c.KIND: ["tokens"],
    c.TENANT: ["acme"],
    c.CAUSE: ["admission_queue", "upstream_error"],
    c.SETTING: ["max_num_seqs"],
    c.CLASS_SOURCE: list(c.CLASS_SOURCES),
}
VLLM_BUCKETS = (0.01, 0.1, 1.0, 10.0)


def _labels(d: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(d.items())) + "}" if d else ""


def _label_sets(metric: c.Metric, config: Config) -> list[dict[str, str]]:
    """Every label combination the sidecar could export for ``metric`` under ``config``."""
    if c.LANE in metric.labels:
        firsts = [
            {c.LANE: lane.name, **({c.POOL: lane.pool} if c.POOL in metric.labels else {})}
            for lane in config.lanes
        ]
    elif c.POOL in metric.labels:
        firsts = [{c.POOL: p.name} for p in config.pools]
    else:
        firsts = [{}]
    rest = [n for n in metric.labels if n not in (c.LANE, c.POOL)]
    combos = itertools.product(*(FIXED[n] for n in rest))
    return [
        {**f, **dict(zip(rest, combo, strict=True))}
        for f, combo in itertools.product(firsts, list(combos))
    ]


def _family(name: str, series: list[tuple[dict[str, str], float]], t0: int) -> Iterator[str]:
    """Samples of ``name``: each series grows by its per-step increment (0 = constant 0.5)."""
    for labels, inc in series:
        for i in range(SAMPLES):
            value = inc * i if inc else 0.5
            yield f"{name}{_labels(labels)} {value} {t0 + i * STEP_S}"


def _histogram(
    name: str, labels: dict[str, str], bounds: tuple[float, ...], t0: int
) -> Iterator[str]:
    for le in (*bounds, float("inf")):
        share = 1.0 if le == float("inf") else le / (le + 0.2)
        le_text = "+Inf" if le == float("inf") else c.bucket_le(le)
        yield from _family(f"{name}_bucket", [({**labels, "le": le_text}, 10 * share)], t0)
    yield from _family(f"{name}_count", [(labels, 10.0)], t0)
    yield from _family(f"{name}_sum", [(labels, 3.0)], t0)


def _openmetrics(config: Config, t0: int) -> Iterator[str]:
    latency = c.merged_buckets(c.LATENCY_BUCKETS, config.slo_thresholds_s("ttft"))
    token = c.merged_buckets(c.TOKEN_LATENCY_BUCKETS, config.slo_thresholds_s("tpot"))
    for m in c.ALL_METRICS:
        sets = _label_sets(m, config)
        if m.kind == "histogram":
            bounds = token if m in (c.TPOT, c.ITL, c.ITL_REQUEST_P95) else latency
            for labels in sets:
                yield from _histogram(m.name, labels, bounds, t0)
        elif m.kind == "counter":
            yield from _family(m.series[0], [(s, 2.0) for s in sets], t0)
        else:
            yield from _family(m.name, [(s, 0.0) for s in sets], t0)
    engine = [{c.POOL: p.name, "model_name": "m", "engine": "0"} for p in config.pools]
    for name in c.VLLM_METRICS:
        if name.endswith("_seconds"):
            for labels in engine:
                yield from _histogram(name, labels, VLLM_BUCKETS, t0)
        elif name.endswith("_total"):
            yield from _family(name, [(s, 2.0) for s in engine], t0)
        else:
            yield from _family(name, [(s, 0.0) for s in engine], t0)
    # dcgm-exporter's host label, Hostname up to 4.5.3-4.8.2 and hostname after: one of each.
    hosts = itertools.cycle(("Hostname", "hostname"))
    gpus = [{"gpu": "0", next(hosts): "node-a", "pod": f"vllm-{p.name}-0"} for p in config.pools]
    for name in c.DCGM_METRICS:
        yield from _family(name, [(s, 0.0) for s in gpus], t0)
    for lane in config.lanes:
        for o in objectives(lane):
            labels = {c.LANE: lane.name, c.SLO_LABEL: o.kind}
            windows = {w for b in lane.slo.burn_windows for w in (b.long, b.short)}
            names = [c.SLO_OBJECTIVE_RULE, c.ERROR_BUDGET_REMAINING_RULE]
            names += [f(w) for w in sorted(windows) for f in (c.sli_error_rule, c.burn_rate_rule)]
            for name in names:
                yield from _family(name, [(labels, 0.0)], t0)
            for w in sorted(windows):
                for phase, cause in (("queue", "admission_queue"), ("prefill", "other")):
                    split = {**labels, c.PHASE: phase}
                    yield from _family(c.burn_by_phase_rule(w), [(split, 0.0)], t0)
                    split[c.CAUSE] = cause
                    yield from _family(c.burn_by_cause_rule(w), [(split, 0.0)], t0)
    yield "# EOF"


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as r:
        data: dict[str, Any] = json.loads(r.read())
        return data


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, Config]]:
    """A Prometheus on loopback holding the synthetic series; yields (url, eval time, config)."""
    promtool, binary = require_binary("promtool"), require_binary("prometheus")
    config = load_config(default_config_path())
    root = tmp_path_factory.mktemp("prometheus")
    t0 = (int(time.time()) // 3600 - 3) * 3600  # whole hours back: blocks outside the head
    data = root / "series.txt"
    data.write_text("\n".join(_openmetrics(config, t0)) + "\n", encoding="utf-8")
    tsdb = root / "tsdb"
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(data), str(tsdb)],
        check=True,
        capture_output=True,
    )
    (root / "prometheus.yml").write_text("global: {}\n", encoding="utf-8")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = root / "prometheus.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={root / 'prometheus.yml'}",
                f"--storage.tsdb.path={tsdb}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=30d",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    tail = log_path.read_text(errors="replace")[-2000:]
                    pytest.fail(f"prometheus did not start:\n{tail}")
                time.sleep(0.2)
        yield url, t0 + (SAMPLES - 1) * STEP_S, config
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_every_panel_query_returns_data(prometheus: tuple[str, int, Config]) -> None:
    """Each query (variables at their defaults, range 10m) succeeds and returns a sample."""
    url, at, config = prometheus
    empty, failed = [], []
    for uid, title, expr in all_queries(config, values={"__range": "10m"}):
        query = urllib.parse.urlencode({"query": expr, "time": at})
        try:
            result = _get(f"{url}/api/v1/query?{query}")["data"]["result"]
        except urllib.error.HTTPError as e:
            failed.append(f"{uid} / {title}: {e.read().decode(errors='replace')}\n  {expr}")
            continue
        if not result:
            empty.append(f"{uid} / {title}: {expr}")
    assert not failed, "\n".join(failed)
    assert not empty, "\n".join(empty)


def test_lane_filter_narrows_the_result(prometheus: tuple[str, int, Config]) -> None:
    """With lane=chat, per-lane queries return chat's series only (joins included)."""
    url, at, config = prometheus
    for uid, title, expr in all_queries(config, values={"lane": "chat", "__range": "10m"}):
        if "by (lane" not in expr and "lane_info" not in expr:
            continue
        query = urllib.parse.urlencode({"query": expr, "time": at})
        for sample in _get(f"{url}/api/v1/query?{query}")["data"]["result"]:
            assert sample["metric"].get(c.LANE, "chat") == "chat", (uid, title, sample)
