"""Benchmark reading a replica's ``/metrics`` page into the pool state (one pool poll).

Times ``obs.sidecar.pools.engine_scrape.read_state`` (the page cut to the adapter's
families, then parsed with prometheus_client's text parser) against parsing the
whole page with the same parser, on each engine's page in tests/data:

    .venv/bin/python bench/pool_poll.py

The sidecar polls each replica every ``--pool-poll-interval`` seconds (5 by
default) on its event loop, so this is event-loop time per replica and poll.
This is a benchmark, not a test: it prints the figures.
"""

from __future__ import annotations

import timeit
from pathlib import Path

from obs.sidecar.pools.engine_scrape import parse_sums, read_state

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
PAGES = {
    "vllm": "vllm-0.32-cpu-metrics.txt",
    "sglang": "sglang-metrics.txt",
    "tgi": "tgi-metrics.txt",
}


def _best_ms(fn: object, number: int) -> float:
    times = timeit.repeat(fn, number=number, repeat=5)  # type: ignore[arg-type]
    return min(times) / number * 1e3


def main() -> None:
    print(f"{'engine':8} {'page':>8} {'read_state':>11} {'whole page':>11}")
    for engine, name in PAGES.items():
        text = (DATA / name).read_text()
        fast = _best_ms(lambda t=text, e=engine: read_state(e, t), 200)
        whole = _best_ms(lambda t=text: parse_sums(t), 20)
        print(f"{engine:8} {len(text) / 1024:6.1f}kB {fast:9.3f}ms {whole:9.3f}ms")


if __name__ == "__main__":
    main()
