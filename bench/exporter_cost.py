"""What each exporter costs per finished request, in-process (microseconds).

The relay hands every finished request to the exporters once, on the event
loop. This measures, per exporter on its own, for a typical streamed request
(``--tokens``, 80 by default: 79 inter-token gaps):

  on loop   wall time inside ``export()`` on the event-loop thread (what
            delays other streams; includes waiting for the GIL while an
            exporter's own thread holds it, so it is noisy on a busy machine)
  total     process CPU per request, background threads included (the JSONL
            writer thread; the span, GenAI metrics and log record batchers
            encoding protobuf and posting it to a real OTLP/HTTP receiver in
            another process)

and, as ``record``, the sidecar's whole record path: ``create_app``'s recorder (timings,
the processors, the miss stamp) ending in JSONL, spans to the receiver and the metrics, as
``bench.relay`` runs the sidecar. ``--tokens 2`` is the bar's short request.

    .venv/bin/python -m bench.exporter_cost --requests 20000
    .venv/bin/python -m bench.exporter_cost --requests 20000 --tokens 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry

from obs import conventions as c
from obs.config import single_upstream
from obs.events import Event
from obs.exporters.jsonl import JsonlExporter
from obs.exporters.otel import OtlpSettings, SpanExporter
from obs.exporters.otlp_logs import LogRecordExporter
from obs.exporters.otlp_metrics import GenAiMetricsExporter
from obs.exporters.prom import Metrics
from obs.phases import Clock
from obs.procs import free_port
from obs.record import Finished, fill_timings
from obs.sidecar.app import create_app
from obs.sidecar.settings import Settings
from obs.tracecontext import new_ids

TOKENS = 80
UPSTREAM = single_upstream("http://127.0.0.1:8001")


def finished(i: int, tokens: int = TOKENS) -> Finished:
    """A finished streamed chat request as the relay builds it."""
    t0 = time.perf_counter_ns()
    ms = 1_000_000
    clock = Clock(
        received=t0,
        dispatched=t0 + ms // 10,
        first_up=t0 + 20 * ms,
        first_sent=t0 + 20 * ms + 50_000,
        last_up=t0 + (20 + 5 * (tokens - 1)) * ms,
        end=t0 + (20 + 5 * (tokens - 1)) * ms + 100_000,
    )
    ev = Event(route="/v1/chat/completions")
    ev.ts, ev.request_id, ev.model = "2026-11-21T00:00:00.000+00:00", f"req-{i}", "tiny"
    ev.lane = ev.pool = "default"
    ev.replica, ev.stream, ev.status, ev.http_status = "http://127.0.0.1:8001", True, c.OK, 200
    ev.prompt_tokens, ev.completion_tokens, ev.cached_tokens = 128, tokens, 0
    ev.finish_reason, ev.max_tokens, ev.prefix_fingerprint = "length", tokens, "0123456789abcdef"
    ids = new_ids(None)
    ev.trace_id, ev.span_id = ids.trace_id_hex, ids.span_id_hex
    f = Finished(
        ev, clock, time.time_ns(), ids, [5 * ms + (j % 7) * 1000 for j in range(tokens - 1)]
    )
    fill_timings(f)
    return f


def _wait_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.1)
    raise RuntimeError("the OTLP receiver did not start")


@contextlib.contextmanager
def receiver_process() -> Iterator[int]:
    """A real OTLP receiver (``OtlpReceiver``) in another process, up: its port."""
    port = free_port()
    receiver = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from obs.sidecar.testing import OtlpReceiver; "
            f"OtlpReceiver({port}).start(); time.sleep(3600)",
        ]
    )
    try:
        _wait_port(port, receiver)
        yield port
    finally:
        receiver.terminate()
        receiver.wait(10)


def _cpu() -> float:
    return time.process_time()


def measure(
    name: str,
    export: Callable[[Finished], None],
    flush: Callable[[], object],
    n: int,
    tokens: int = TOKENS,
) -> dict[str, float]:
    items = [finished(i, tokens) for i in range(n)]
    for f in items[: n // 10]:  # warm
        export(f)
    flush()
    on_loop = 0
    cpu0 = _cpu()
    for f in items:
        t = time.perf_counter_ns()
        export(f)
        on_loop += time.perf_counter_ns() - t
    flush()
    total = _cpu() - cpu0
    row = {"on_loop_us": on_loop / n / 1000, "total_cpu_us": total / n * 1e6}
    print(
        f"{name:12s} on loop {row['on_loop_us']:7.1f} us/request   "
        f"total CPU {row['total_cpu_us']:7.1f} us/request",
        file=sys.stderr,
        flush=True,
    )
    return row


def _record(traces_url: str, work: Path, n: int, tokens: int) -> dict[str, float]:
    """The sidecar's record path as ``create_app`` builds it, every exporter of the bench on."""
    # Room for every span: the batcher must encode and send them all, not drop them.
    os.environ["OTEL_BSP_MAX_QUEUE_SIZE"] = str(7 * n)
    settings = Settings(UPSTREAM, events_path=work / "record.jsonl", otlp_endpoint=traces_url)
    app = create_app(settings, registry=CollectorRegistry())
    exporters = app.exporters.exporters

    def flush() -> None:
        for x in exporters:
            x.force_flush()

    try:
        return measure("record", app.recorder.end, flush, n, tokens)
    finally:
        app.exporters.shutdown()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.exporter_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--tokens", type=int, default=TOKENS, help="output tokens per request")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="default: bench/results/exporter_cost[-TOKENStok].json",
    )
    args = ap.parse_args(argv)
    n, tokens = args.requests, args.tokens
    if args.out is None:
        suffix = "" if tokens == TOKENS else f"-{tokens}tok"
        args.out = Path(f"bench/results/exporter_cost{suffix}.json")
    results: dict[str, dict[str, float]] = {}
    work = Path(tempfile.mkdtemp(prefix="vllm-obs-exporter-cost-"))

    results["fill_timings"] = measure("fill_timings", fill_timings, lambda: None, n, tokens)

    metrics = Metrics(single_upstream("http://127.0.0.1:8001"), CollectorRegistry())
    results["metrics"] = measure("metrics", metrics.export, lambda: None, n, tokens)
    # the same without the trace-id exemplars on TTFT, TPOT and end-to-end: what they cost
    bare = Metrics(single_upstream("http://127.0.0.1:8001"), CollectorRegistry(), exemplars=False)
    results["metrics_no_exemplars"] = measure("no exemplars", bare.export, lambda: None, n, tokens)

    jsonl = JsonlExporter(work / "events.jsonl")
    results["events"] = measure("events", jsonl.export, jsonl.force_flush, n, tokens)
    jsonl.shutdown()

    with receiver_process() as port:
        # Room for every span: the batcher must encode and send them all, not drop them.
        settings = OtlpSettings(f"http://127.0.0.1:{port}/v1/traces", max_queue_spans=7 * n)
        spans = SpanExporter(settings)
        results["spans"] = measure("spans", spans.export, spans.force_flush, n, tokens)
        spans.shutdown()
        base = f"http://127.0.0.1:{port}"
        config = single_upstream("http://127.0.0.1:8001")
        resource = {"service.name": "vllm-obs-bench"}
        genai = GenAiMetricsExporter(OtlpSettings(f"{base}/v1/metrics"), config, resource=resource)
        results["genai_metrics"] = measure(
            "genai_metrics", genai.export, genai.force_flush, n, tokens
        )
        genai.shutdown()
        logs_settings = OtlpSettings(f"{base}/v1/logs", max_queue_spans=2 * n)
        logs = LogRecordExporter(logs_settings, resource=resource)
        results["log_records"] = measure("log_records", logs.export, logs.force_flush, n, tokens)
        logs.shutdown()
        results["record"] = _record(f"{base}/v1/traces", work, n, tokens)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"requests": n, "tokens": tokens, **results}, indent=2) + "\n")
    print("| exporter | on the event loop (us/request) | total CPU (us/request) |")
    print("|---|---|---|")
    for name, row in results.items():
        print(f"| {name} | {row['on_loop_us']:.1f} | {row['total_cpu_us']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
