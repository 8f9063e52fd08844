"""What handing each pool read to the relay through an awaitable would cost, per read.

The relay's per-token path runs inside the pool socket's callback: the pool client calls
``StreamSink.on_body`` with each read (docs/architecture.md, "Inside the sidecar"). The
alternative the architecture weighs is an awaitable: the socket callback appends the read and
completes a future, and the relay coroutine, woken, takes the read and runs the same sink.
This measures both on uvloop, in one process, one read per event-loop turn as a stream's
reads come: the CPU per read of the loop turn and the sink call (``callback``), against the
same plus a future and a task step per read (``awaitable``).

    .venv/bin/python -m bench.callback_cost --reads 200000 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import deque

import uvloop


class Sink:
    """Stands for ``StreamSink``: the same work in both shapes, so only the hand-over differs."""

    def __init__(self) -> None:
        self.reads = 0

    def on_body(self, data: bytes) -> None:
        self.reads += 1


async def callback(reads: int, sink: Sink) -> None:
    """Each read handed to the sink inside the socket's callback (the relay today)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    left = [reads]

    def socket_read() -> None:
        sink.on_body(b"x")
        left[0] -= 1
        if left[0]:
            loop.call_soon(socket_read)
        else:
            done.set_result(None)

    loop.call_soon(socket_read)
    await done


async def awaitable(reads: int, sink: Sink) -> None:
    """Each read queued and a future completed; the relay's coroutine wakes and runs the sink."""
    loop = asyncio.get_running_loop()
    queue: deque[bytes | None] = deque()
    waiter: list[asyncio.Future[None] | None] = [None]
    left = [reads]

    def socket_read() -> None:
        left[0] -= 1
        queue.append(b"x" if left[0] >= 0 else None)
        if (w := waiter[0]) is not None and not w.done():
            w.set_result(None)
        if left[0] >= 0:
            loop.call_soon(socket_read)

    loop.call_soon(socket_read)
    while True:
        while not queue:
            waiter[0] = fut = loop.create_future()
            await fut
        data = queue.popleft()
        if data is None:
            return
        sink.on_body(data)


async def measure(reads: int, runs: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"callback": [], "awaitable": []}
    for _ in range(runs):
        for name, shape in (("callback", callback), ("awaitable", awaitable)):
            sink = Sink()
            t0 = time.process_time()
            await shape(reads, sink)
            out[name].append((time.process_time() - t0) / reads * 1e6)
            assert sink.reads == reads
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.callback_cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--reads", type=int, default=200_000, help="reads per run")
    ap.add_argument("--runs", type=int, default=3, help="runs of each shape, interleaved")
    args = ap.parse_args(argv)
    if args.reads < 1 or args.runs < 1:
        ap.error("--reads and --runs must be positive")
    result = uvloop.run(measure(args.reads, args.runs))
    for name, us in result.items():
        runs = ", ".join(f"{u:.2f}" for u in us)
        print(f"{name:10s} {min(us):.2f} us CPU per read (runs: {runs})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
