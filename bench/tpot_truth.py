"""The events' TPOT against the engine's own, with vLLM's spans joined, per concurrency.

Starts a real `vllm serve` (tiny model) that exports its `llm_request` spans to a sidecar in
front of it (`--engine-traces`), and sends streamed chats through the sidecar at each
concurrency, in two arms interleaved round by round:

- **as is**: every process at the same scheduling priority;
- **sidecar first**: the sidecar's process at nice -10 (vLLM's API server and engine, the
  load generator: nice 0), so the kernel runs it whenever it is ready.

For the joined events of each arm it prints the sum of the events' TPOT over the sum of the
engine's (`engine_decode_ms / (completion_tokens - 1)`): with the span joined the event takes
the engine's own, so this checks that the record carries it. Beside it, the same ratio on the
sidecar's clock (its decode phase per token after the first, per request and summed), and the
sidecar's CPU seconds per 1000 tokens. If the sidecar's clock is over the engine's as is and
closer with the sidecar first, the excess is the sidecar waiting for a CPU.

    .venv/bin/python -m bench.tpot_truth --concurrency 1 4 8 --requests 64 --rounds 2

Needs root (or CAP_SYS_NICE) for the second arm; without it only the first runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.procs import ProcStat
from obs.engines.server import VllmServer
from obs.engines.setup import ensure_engine
from obs.procs import free_port
from obs.sidecar.testing import OtlpReceiver, SidecarProcess

CHAT = "/v1/chat/completions"
ARMS = ("as_is", "sidecar_first")


def send_all(url: str, concurrency: int, requests: int, max_tokens: int) -> list[str]:
    """``requests`` streamed chats, ``concurrency`` at a time, read to the end; their ids."""
    ids = [uuid.uuid4().hex for _ in range(requests)]
    todo = iter(ids)
    lock = threading.Lock()

    def worker() -> None:
        with httpx.Client(base_url=url, timeout=120) as client:
            while True:
                with lock:
                    rid = next(todo, None)
                if rid is None:
                    return
                body = {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": f"def f_{rid[:6]}(n):"}],
                    "max_tokens": max_tokens,
                    "stream": True,
                    "ignore_eos": True,
                }
                with client.stream("POST", CHAT, json=body, headers={"X-Request-Id": rid}) as r:
                    for _ in r.iter_raw():
                        pass

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ids


def ratio(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum of the events' TPOT over the engine's, on the joined events with 2+ tokens."""
    joined = [
        e
        for e in events
        if e.get("engine_view") == "joined"
        and e.get("tpot_ms") is not None
        and e.get("engine_decode_ms") is not None
        and (e.get("completion_tokens") or 0) > 1
    ]
    ours = sum(e["tpot_ms"] for e in joined)
    relay = sum(e["decode_ms"] / (e["completion_tokens"] - 1) for e in joined)
    engine = sum(e["engine_decode_ms"] / (e["completion_tokens"] - 1) for e in joined)
    per = sorted(  # the sidecar's clock, per request
        (e["decode_ms"] / e["engine_decode_ms"]) for e in joined if e["engine_decode_ms"] > 0
    )
    keys = (
        "tpot_ms",
        "engine_decode_ms",
        "decode_ms",
        "ttft_ms",
        "engine_ttft_ms",
        "completion_tokens",
        "burst_chunks",
        "e2e_ms",
        "engine_queue_ms",
        "queue_ms",
    )
    worst = sorted(
        joined,
        key=lambda e: (
            e["tpot_ms"] * (e["completion_tokens"] - 1) / max(e["engine_decode_ms"], 1e-6)
        ),
    )[-3:]
    return {
        "worst": [{k: e.get(k) for k in keys} for e in worst],
        "joined": len(joined),
        "events_tpot_sum_over_engine": ours / engine if engine else float("nan"),
        "relay_clock_over_engine": relay / engine if engine else float("nan"),
        "per_request_p90": per[int(0.9 * (len(per) - 1))] if per else float("nan"),
        "per_request_max": per[-1] if per else float("nan"),
    }


@contextlib.contextmanager
def niced(pid: int, value: int) -> Iterator[bool]:
    """``pid`` (all its threads) at niceness ``value`` for the block; False if not allowed."""
    tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    try:
        for tid in tids:
            os.setpriority(os.PRIO_PROCESS, tid, value)
    except PermissionError:
        yield False
        return
    try:
        yield True
    finally:
        for tid in tids:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, tid, 0)


@contextlib.contextmanager
def stack(work: Path) -> Iterator[SidecarProcess]:
    """vLLM exporting its spans to a sidecar in front of it (the sidecar's own spans go to a
    local receiver, as with every exporter on)."""
    paths = ensure_engine()
    receiver = OtlpReceiver().start()
    port = free_port()
    os.environ["OTEL_BSP_SCHEDULE_DELAY"] = "200"  # vLLM batches spans for 5 s by default
    with VllmServer(
        paths.model_dir,
        otlp_traces_endpoint=f"http://127.0.0.1:{port}/v1/traces",
        log_path=work / "vllm.log",
        python=paths.python,
        launcher=paths.launcher,
    ) as vllm:
        sc = SidecarProcess(
            upstream=vllm.url,
            events=work / "events.jsonl",
            args=("--engine-traces", "--engine-join-wait", "5"),
            env={
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url,
                "OTEL_BSP_SCHEDULE_DELAY": "100",
            },
            log_path=work / "sidecar.log",
            port=port,
        ).start()
        try:
            yield sc
        finally:
            sc.stop()
            receiver.stop()


def run_arm(sc: SidecarProcess, arm: str, conc: int, args: argparse.Namespace) -> dict[str, Any]:
    """One arm at one concurrency: the ratio over its events and the sidecar's CPU."""
    cpu = ProcStat(sc.pid)
    with niced(sc.pid, -10 if arm == "sidecar_first" else 0) as applied:
        if not applied:
            return {"skipped": "no permission to renice"}
        before, cpu0 = len(sc.events()), cpu.cpu_s()
        ids = set(send_all(sc.url, conc, args.requests, args.max_tokens))
        cpu_s = cpu.cpu_s() - cpu0
    events = [e for e in sc.wait_events(before + len(ids), timeout_s=60) if e["request_id"] in ids]
    tokens = sum(e.get("completion_tokens") or 0 for e in events)
    return ratio(events) | {
        "sidecar_cpu_s_per_1k_tokens": 1000 * cpu_s / tokens if tokens else float("nan"),
        "load_average_1m": os.getloadavg()[0],
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--requests", type=int, default=64, help="requests per arm and round")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("bench/results/tpot_truth.json"))
    args = ap.parse_args()
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory(prefix="vllm-obs-tpot-") as tmp, stack(Path(tmp)) as sc:
        send_all(sc.url, 2, 8, args.max_tokens)  # warm-up, not counted
        for conc in args.concurrency:
            for rnd in range(args.rounds):
                for arm in ARMS if rnd % 2 == 0 else ARMS[::-1]:
                    r = run_arm(sc, arm, conc, args)
                    results.setdefault(str(conc), {}).setdefault(arm, []).append(r)
                    print(f"[tpot-truth] c{conc} round {rnd} {arm}: {r}", flush=True)
    print(
        "| concurrency | arm | joined | events' TPOT / engine's | sidecar's clock / engine's "
        "| per-request p90 | max | sidecar CPU s / 1k tokens |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for conc, arms in results.items():
        for arm, rounds in arms.items():
            done = [r for r in rounds if "skipped" not in r]
            if not done:
                continue
            j = sum(r["joined"] for r in done)
            mean = {
                k: sum(r[k] for r in done) / len(done)
                for k in (
                    "events_tpot_sum_over_engine",
                    "relay_clock_over_engine",
                    "per_request_p90",
                    "per_request_max",
                    "sidecar_cpu_s_per_1k_tokens",
                )
            }
            print(
                f"| {conc} | {arm} | {j} | {mean['events_tpot_sum_over_engine']:.3f} | "
                f"{mean['relay_clock_over_engine']:.3f} | "
                f"{mean['per_request_p90']:.2f} | {mean['per_request_max']:.2f} | "
                f"{mean['sidecar_cpu_s_per_1k_tokens']:.3f} |"
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, **results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
