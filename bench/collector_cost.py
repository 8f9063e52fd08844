"""What Python's cycle collector costs the relay per request, and what it frees.

A request whose objects form a reference cycle is freed only by the cycle collector: under load
its whole graph waits in the young generation, is traversed, promoted and traversed again.
This measures it from outside the sidecar: a hook in each sidecar process (a ``sitecustomize``
put on its ``PYTHONPATH``; the sidecar's code is not changed) times every collection by
generation (``gc.callbacks``) and counts the objects it freed. ``bench/fake_vllm.py`` (TTFT 0)
is the pool, every exporter is on (JSONL, spans to a receiver in another process), and the
client is aiohttp: ``--requests`` short streams (2 tokens) at ``--concurrency`` streams per run,
each target in turn for ``--rounds`` rounds. ``--extra-sidecar NAME=PATH`` runs another
checkout's sidecar (an importable ``obs`` tree at PATH) in the same rounds.

Per target and round it prints, per request: the objects the collector freed (what reference
counting could not: cycles), its CPU time in µs, and the process's CPU in ms (all threads).

    .venv/bin/python -m bench.collector_cost --requests 6000 --rounds 3
    .venv/bin/python -m bench.collector_cost --extra-sidecar before=/tmp/before-tree
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

from bench.peers import MODEL
from bench.procs import FakeVllm, ProcStat
from obs.sidecar.testing import OtlpReceiver, SidecarProcess

STATS_ENV = "VLLM_OBS_BENCH_GC_STATS"  # where the hook below writes (named in it)
# The hook: gc.callbacks time each collection in CPU time of the thread it ran on (wall time
# would count the process's waits for a core on a busy machine); a thread writes the totals
# every 0.1 s.
HOOK = """
import gc, json, os, threading, time
_path = os.environ.get("VLLM_OBS_BENCH_GC_STATS")
if _path:
    _totals = {"collections": [0, 0, 0], "seconds": [0.0, 0.0, 0.0], "collected": [0, 0, 0]}
    _began = {}
    def _timed(phase, info):
        g = info["generation"]
        if phase == "start":
            _began[g] = time.thread_time()
        elif g in _began:
            _totals["collections"][g] += 1
            _totals["seconds"][g] += time.thread_time() - _began.pop(g)
            _totals["collected"][g] += info["collected"]
    gc.callbacks.append(_timed)
    def _write():
        while True:
            time.sleep(0.1)
            with open(_path + ".tmp", "w") as f:
                json.dump(_totals, f)
            os.replace(_path + ".tmp", _path)
    threading.Thread(target=_write, daemon=True).start()
"""
BODY = {
    "model": MODEL,
    "prompt": "hello there " * 20,
    "max_tokens": 2,
    "stream": True,
    "stream_options": {"include_usage": True},
}


@dataclass
class Run:
    """One target's run: per request, what the collector freed, its time, the CPU."""

    target: str
    round: int
    requests: int
    freed_per_request: float
    collector_us_per_request: float
    cpu_ms_per_request: float
    collections: list[int]


class Target:
    """A sidecar with the hook, and where its totals are read."""

    def __init__(self, name: str, sidecar: SidecarProcess, stats: Path) -> None:
        self.name, self.sidecar, self.stats = name, sidecar, stats

    def totals(self) -> dict[str, list[float]]:
        time.sleep(0.25)  # the hook's next write
        return dict(json.loads(self.stats.read_text()))


async def _load(url: str, requests: int, concurrency: int) -> None:
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        gate = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with gate, session.post(url + "/v1/completions", json=BODY) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{url}: status {r.status}")

        await asyncio.gather(*(one() for _ in range(requests)))


def measure(target: Target, requests: int, concurrency: int, rnd: int) -> Run:
    stat = ProcStat(target.sidecar.pid)
    before, cpu0 = target.totals(), stat.cpu_s()
    asyncio.run(_load(target.sidecar.url, requests, concurrency))
    cpu = stat.cpu_s() - cpu0
    after = target.totals()
    per = [after["collections"][g] - before["collections"][g] for g in range(3)]
    return Run(
        target=target.name,
        round=rnd,
        requests=requests,
        freed_per_request=(sum(after["collected"]) - sum(before["collected"])) / requests,
        collector_us_per_request=(sum(after["seconds"]) - sum(before["seconds"])) * 1e6 / requests,
        cpu_ms_per_request=cpu * 1e3 / requests,
        collections=[int(n) for n in per],
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.collector_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--requests", type=int, default=6000, help="short streams per run")
    ap.add_argument("--concurrency", type=int, default=64, help="streams at once")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the targets")
    ap.add_argument(
        "--extra-sidecar",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="another checkout's sidecar (an importable obs tree at PATH)",
    )
    ap.add_argument("--out", type=Path, help="write the runs as JSON here")
    args = ap.parse_args(argv)
    for spec in args.extra_sidecar:
        name, sep, path = spec.partition("=")
        if not sep or not name or not Path(path, "obs").is_dir():
            ap.error(f"--extra-sidecar {spec!r}: NAME=PATH, with an obs package under PATH")
    if args.requests < 1 or args.concurrency < 1 or args.rounds < 1:
        ap.error("--requests, --concurrency and --rounds must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="vllm-obs-collector-cost-"))
    hook_dir = work / "hook"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(HOOK)
    trees = {"sidecar": os.getcwd(), **dict(s.split("=", 1) for s in args.extra_sidecar)}
    receiver = OtlpReceiver().start()
    fake = FakeVllm(work, ttft_ms=0, itl_ms=0)
    fake.start()
    targets: list[Target] = []
    runs: list[Run] = []
    try:
        for name, tree in trees.items():
            stats = work / f"{name}-gc.json"
            env = {k: "" for k in os.environ if k.startswith("OTEL_")}
            env.update({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url, STATS_ENV: str(stats)})
            env["PYTHONPATH"] = os.pathsep.join([tree, str(hook_dir)])
            sc = SidecarProcess(
                upstream=fake.url,
                events=work / f"{name}-events.jsonl",
                env=env,
                log_path=work / f"{name}.log",
                args=["--log-level", "warning"],
            )
            with contextlib.chdir(tree):  # `python -m` puts the working directory first
                sc.start()
            targets.append(Target(name, sc, stats))
            asyncio.run(_load(sc.url, 300, args.concurrency))  # warm-up
        for rnd in range(1, args.rounds + 1):
            for target in targets:
                run = measure(target, args.requests, args.concurrency, rnd)
                runs.append(run)
                print(
                    f"round {rnd} {run.target:<10} {run.requests} req: freed by the collector "
                    f"{run.freed_per_request:.2f} objects, "
                    f"{run.collector_us_per_request:.1f} µs, "
                    f"CPU {run.cpu_ms_per_request:.3f} ms per request "
                    f"(collections by generation {run.collections})",
                    flush=True,
                )
    finally:
        for target in targets:
            target.sidecar.stop()
        fake.stop()
        receiver.stop()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps([asdict(r) for r in runs], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
