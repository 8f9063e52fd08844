"""CPU per short request of each of a sidecar's threads, sidecars side by side.

The relay bar (``bench.relay_bar``) reads a sidecar's CPU as one figure, and between
sessions that figure moves by more than most changes are worth. This reads each thread
of the process (``/proc/PID/task``: the event loop and every exporter's thread) around a
run, so a change to one exporter shows in its own thread. It starts one fast fake pool
(TTFT 0, as the bar's ``short`` level), one real OTLP/HTTP receiver, and one sidecar per
``NAME=PATH`` (``PATH`` holds an importable ``obs``, such as a copy of another checkout;
``.`` is this one; a ``:spans`` suffix turns span export on for that sidecar), then, each
round in a rotated order, sends ``--requests`` two-token streamed chat requests at 64
streams with a keep-alive aiohttp client and prints, per sidecar, the CPU microseconds
per request of each thread and how many requests each span POST carried.

    .venv/bin/python -m bench.thread_cpu base=/tmp/copy-of-main:spans new=.:spans --rounds 3

``/proc``'s clock ticks are 10 ms: at 4000 requests a run a figure moves in 2.5 µs steps.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.procs import FAKE_POOLS, FakeVllm, stat_cpu_s
from obs.sidecar.testing import OtlpReceiver, SidecarProcess

BODY = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "hello " * 100}],
    "stream": True,
    "stream_options": {"include_usage": True},
    "max_tokens": 2,
}


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of ``pid``: ``loop`` for the main thread, else its id."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        name = "loop" if task.name == str(pid) else f"thread-{task.name}"
        with contextlib.suppress(OSError):  # the thread ended between the listing and the read
            out[name] = stat_cpu_s(task / "stat")
    return out


async def _requests(url: str, n: int, streams: int = 64) -> None:
    async def one(s: aiohttp.ClientSession) -> None:
        async with s.post(url + "/v1/chat/completions", json=BODY) as r:
            async for _ in r.content.iter_any():
                pass

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=streams)) as s:
        await asyncio.gather(*(one(s) for _ in range(streams)))  # every connection open
        left = [n]

        async def worker() -> None:
            while left[0] > 0:
                left[0] -= 1
                await one(s)

        await asyncio.gather(*(worker() for _ in range(streams)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.thread_cpu",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("sidecars", nargs="+", metavar="NAME=PATH[:spans]")
    ap.add_argument("--requests", type=int, default=4000, help="short requests per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pool", default="fake_vllm", choices=sorted(FAKE_POOLS))
    ap.add_argument(
        "--settle-s", type=float, default=1.0, help="wait after a run before reading the CPU"
    )
    args = ap.parse_args(argv)
    specs: list[tuple[str, Path, bool]] = []
    for spec in args.sidecars:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            ap.error(f"{spec!r}: expected NAME=PATH[:spans]")
        spans = path.endswith(":spans")
        where = Path(path.removesuffix(":spans")).resolve()
        if not (where / "obs").is_dir():
            ap.error(f"{spec!r}: {where} holds no importable obs package")
        specs.append((name, where, spans))
    work = Path(tempfile.mkdtemp(prefix="vllm-obs-thread-cpu-"))
    fake = FakeVllm(work, 0, 5.0, pool=args.pool)
    receiver = OtlpReceiver().start()
    sidecars: dict[str, SidecarProcess] = {}
    try:
        fake.start()
        for name, where, spans in specs:
            env = {k: "" for k in os.environ if k.startswith("OTEL_")}
            env["PYTHONPATH"] = str(where)
            if spans:
                env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = receiver.url
            else:
                env["OTEL_TRACES_EXPORTER"] = "none"
            sc = SidecarProcess(
                upstream=fake.url,
                events=work / f"{name}.jsonl",
                env=env,
                log_path=work / f"{name}.log",
                args=["--log-level", "warning"],
            )
            with contextlib.chdir(where):  # `python -m` imports the cwd's obs first
                sc.start()
            sidecars[name] = sc
        totals: dict[str, list[float]] = {name: [] for name in sidecars}
        names = list(sidecars)
        for rnd in range(args.rounds):
            k = rnd % len(names)
            for name in names[k:] + names[:k]:
                sc = sidecars[name]
                assert sc.proc is not None
                posts0 = len(receiver.raw)
                before = thread_cpu_s(sc.proc.pid)
                asyncio.run(_requests(sc.url, args.requests))
                time.sleep(args.settle_s)
                after = thread_cpu_s(sc.proc.pid)
                per = {t: (after[t] - before.get(t, 0.0)) / args.requests * 1e6 for t in after}
                total = sum(per.values())
                totals[name].append(total)
                posts = len(receiver.raw) - posts0
                each = args.requests / posts if posts else 0
                threads = " ".join(f"{t} {us:.0f}" for t, us in sorted(per.items()) if us >= 0.5)
                print(
                    f"round {rnd + 1} {name}: {total:.0f} us/request ({threads}); "
                    f"{posts} span POSTs, {each:.0f} requests each",
                    flush=True,
                )
        for name, vals in totals.items():
            shown = " ".join(f"{v:.0f}" for v in vals)
            print(f"{name}: median {statistics.median(vals):.0f} us/request ({shown})")
    finally:
        for sc in sidecars.values():
            sc.stop()
        fake.stop()
        receiver.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
