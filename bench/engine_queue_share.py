"""Where a saturated real vLLM's TTFT misses go without the engine's spans (#40's first bar).

A ``vllm serve`` with room for 2 sequences (``--max-num-seqs 2``), a sidecar in front of it
without engine traces, and 16 clients streaming at once, each a few requests of 160 tokens
in a row, under a 300 ms TTFT SLO: most requests wait for a slot in the engine. Prints, per
run, the share of the TTFT misses charged to each cause (the bar: at most 10% ``other``, at
least 70% ``engine_queue``) and, with ``--facts``, each miss's phase, cause and the pool's
state at dispatch that the rule read (``obs.engine_queue``), to tell which branch fired.
``--runs`` repeats the load on the same engine, each run with a fresh sidecar (a fresh
baseline). ``--keep DIR`` copies each run's events there (``run-N.jsonl``).

    flock /tmp/w/heavy.lock .venv/bin/python -m bench.engine_queue_share --runs 3 --facts

The test (tests/sidecar/test_budget_engine_queue_vllm.py) drives the same load through
``lanes_config`` and ``saturate``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import openai
import yaml

from obs.engines.server import VllmServer
from obs.engines.setup import ensure_engine
from obs.sidecar.process import SidecarProcess

SLOTS = 2
STREAMS = 16
ROUNDS = 5  # requests per client, one after another (enough misses that one is under 5%)
MAX_TOKENS = 160  # long enough that a wait for a slot misses 300 ms on a fast run too
TTFT_MS = 300
# What the rule reads of a miss (``--facts``), in the order printed.
FACTS = (
    "miss_phase", "miss_cause", "queue_ms", "prefill_ms", "engine_queue_ms", "prompt_tokens",
    "pool_in_flight", "pool_ahead_prompt_tokens", "pool_prompt_tokens_during", "pool_waiting",
    "pool_kv_usage", "pool_preempting",
)  # fmt: skip


def lanes_config(path: Path, url: str, traced: bool = False) -> Path:
    """Write ``path/lanes.yaml``: one pool of ``url`` declaring ``SLOTS`` slots (with vLLM's
    spans joined when ``traced``), one lane under a ``TTFT_MS`` TTFT SLO."""
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


def saturate(sc: SidecarProcess) -> list[dict[str, Any]]:
    """Wait until the sidecar knows the pool's slots, then ``STREAMS`` clients stream at once,
    ``ROUNDS`` requests each; their events (no class header: one lane). RuntimeError when a
    client's request fails."""
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
    if errors:
        raise RuntimeError(f"{len(errors)} client requests failed: {errors[:3]}")
    return sc.wait_events(warm + STREAMS * ROUNDS, timeout_s=30)[warm:]


def ttft_misses(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events that missed the TTFT gate."""
    return [e for e in events if "ttft" in (e.get("miss_slo") or "").split(",")]


def cause_shares(events: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The share of the TTFT misses charged to each cause (by the sidecar's ``miss_cause``:
    the first missed gate's, which is TTFT's when the lane's only SLO is TTFT)."""
    causes = Counter(e["miss_cause"] for e in ttft_misses(events))
    total = sum(causes.values())
    return {c: n / total for c, n in causes.most_common()} if total else {}


def _facts(events: Sequence[dict[str, Any]]) -> None:
    print("  " + " ".join(f"{k.removeprefix('pool_')[:12]:>12}" for k in FACTS))
    for e in ttft_misses(events):
        cells = []
        for k in FACTS:
            v = e.get(k)
            cells.append(f"{v:12.1f}" if isinstance(v, float) else f"{v!s:>12.12}")
        print("  " + " ".join(cells))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1, help="loads on the same engine (default 1)")
    ap.add_argument("--facts", action="store_true", help="print each TTFT miss's facts")
    ap.add_argument("--keep", type=Path, help="copy each run's events here as run-N.jsonl")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    paths = ensure_engine()
    work = Path(tempfile.mkdtemp(prefix="engine-queue-share-"))
    with VllmServer(
        paths.model_dir,
        extra_args=("--max-num-seqs", str(SLOTS)),
        log_path=work / "vllm.log",
        python=paths.python,
        launcher=paths.launcher,
    ) as vllm:
        for run in range(1, args.runs + 1):
            d = work / f"run-{run}"
            with SidecarProcess(
                config=lanes_config(d, vllm.url),
                events=d / "events.jsonl",
                args=("--pool-poll-interval", "1"),
                log_path=d / "sidecar.log",
            ) as sc:
                events = saturate(sc)
            misses = ttft_misses(events)
            shares = ", ".join(f"{c} {s:.0%}" for c, s in cause_shares(events).items())
            inferred = sum(e["engine_view"] == "inferred" for e in events)
            print(
                f"run {run}: {len(misses)}/{len(events)} TTFT misses ({inferred} inferred); "
                f"{shares}",
                flush=True,
            )
            if args.facts:
                _facts(events)
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(d / "events.jsonl", args.keep / f"run-{run}.jsonl")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
