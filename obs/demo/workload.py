"""The demo's traffic: the six-class mix sized for a 2048-token model, the lanes config for
the pools it talks to, and a bounded load run with a live per-lane view.

The load generator (aiohttp) is imported inside :func:`drive`, so importing this module
stays cheap and free of the HTTP client.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import yaml

from obs.config import Config, default_config_path, load_config
from obs.progress import ProgressLine

if TYPE_CHECKING:
    from obs.loadgen.driver import Driver, RunResult
    from obs.loadgen.mix import Mix
    from obs.loadgen.records import Record

CLASSES = ("chat", "rag", "long-prefill", "agent", "batch", "slow-stream")

# The default mix's shapes with lengths cut to fit the tiny model's 2048-token context.
# Lengths are planned at ~4 characters per token; the tiny model's tokenizer makes about
# 1.15 tokens of each, so the longest request (prompt + max_tokens + chat template) stays
# under ~1750 tokens. Weights are the default mix's.
DEMO_MIX: dict[str, Any] = {
    "version": 1,
    "classes": {
        "chat": {"weight": 40, "prompt_tokens": [32, 256], "max_tokens": [32, 128]},
        "rag": {
            "weight": 20,
            "documents": 4,
            "document_tokens": [600, 1000],
            "prompt_tokens": [16, 64],
            "max_tokens": [32, 128],
        },
        "long-prefill": {"weight": 10, "prompt_tokens": [1000, 1400], "max_tokens": [16, 48]},
        "agent": {
            "weight": 15,
            "context_tokens": [300, 500],
            "turns": [3, 5],
            "prompt_tokens": [40, 120],
            "max_tokens": [24, 64],
            "think_time_s": [0.5, 2.0],
        },
        "batch": {"weight": 5, "prompt_tokens": [600, 1000], "max_tokens": [256, 512]},
        "slow-stream": {"weight": 10, "prompt_tokens": [32, 128], "max_tokens": [64, 160]},
    },
}
_MIX_HEADER = (
    "# The vllm-obs demo mix: the default six-class mix with lengths sized for the tiny\n"
    "# model's 2048-token context. Replay it: vllm-obs load --mix THIS_FILE --url SIDECAR\n"
)
_LANES_HEADER = (
    "# Written by vllm-obs demo: the shipped default lanes (obs/data/lanes.yaml) with each\n"
    "# pool's replicas pointed at the pools this demo ran. Check it: vllm-obs config check\n"
)
REQUEST_TIMEOUT_S = 120.0
UNLABELLED_CLIENTS = 4  # per class, when clients send no class header (slow readers learned)


def write_mix(path: Path, full_mix: bool) -> Path | None:
    """Write the demo mix overlay to ``path`` (None: the full default mix, nothing written)."""
    if full_mix:
        return None
    path.write_text(_MIX_HEADER + yaml.safe_dump(DEMO_MIX, sort_keys=False), encoding="utf-8")
    return path


def load_demo_mix(mix_path: Path | None, sets: tuple[str, ...]) -> Mix:
    from obs.loadgen.mix import load_mix

    return load_mix(mix_path, sets)


def write_lanes(
    path: Path,
    replicas: Mapping[str, list[str]],
    engines: Mapping[str, Mapping[str, object]] | None = None,
    *,
    traced: bool = False,
) -> Config:
    """The default lanes with each pool's replicas replaced; written to ``path`` and validated.

    Each pool's ``engine:`` block is ``engines[pool]`` (the engine and flags its replicas run
    with); a pool not in ``engines`` declares none (the shipped block names the production
    flags, not what these replicas run). ``traced``: the pools send their request spans to the
    sidecar (``engine_traces``)."""
    data = yaml.safe_load(default_config_path().read_text(encoding="utf-8"))
    for pool in data["pools"]:
        pool["replicas"] = list(replicas[pool["name"]])
        engine = (engines or {}).get(pool["name"])
        if engine is None:
            pool.pop("engine", None)
        else:
            pool["engine"] = dict(engine)
        if traced:
            pool["engine_traces"] = True
    path.write_text(_LANES_HEADER + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return load_config(path)


class LiveView:
    """Requests finished per lane, drawn on ``stream`` as one ``ProgressLine``: redrawn in
    place on a terminal, else a line every ``every_s`` seconds."""

    def __init__(
        self,
        stream: TextIO,
        duration_s: float,
        *,
        in_place: bool,
        every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._duration_s = duration_s
        self._in_place = in_place
        self._clock = clock
        self._start = clock()
        self._line = ProgressLine(stream, in_place=in_place, every_s=every_s, clock=clock)
        self.done: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()

    @property
    def tick_s(self) -> float:
        return 0.5 if self._in_place else 1.0

    def add(self, record: Record) -> None:
        self.done[record.client_class] += 1
        if record.status != "ok":
            self.errors[record.client_class] += 1

    def line(self, inflight: int) -> str:
        elapsed = self._clock() - self._start
        lanes = "  ".join(f"{c} {self.done[c]}" for c in CLASSES)
        errors = sum(self.errors.values())
        clock = f"{min(elapsed, self._duration_s):3.0f}/{self._duration_s:.0f} s"
        if elapsed > self._duration_s:
            clock += f" +{elapsed - self._duration_s:.0f} s draining"
        return f"  [{clock}] done per lane: {lanes} | in flight {inflight}, errors {errors}"

    def update(self, inflight: int, final: bool = False) -> None:
        self._line.draw(self.line(inflight), final=final)


@dataclass
class LoadOutcome:
    result: RunResult | None
    stopped_early: bool  # the first Ctrl-C: no new requests, in-flight ones finished
    aborted_by: int | None  # SIGTERM or a second Ctrl-C: the run was cancelled


def drive(
    url: str,
    mix: Mix,
    *,
    duration_s: float,
    rate: float,
    seed: int,
    run_id: str,
    records: Path,
    view: LiveView,
    notice: Callable[[str], None],
    sessions: int | None = None,
    whole_plan: bool = False,
    class_header: bool = True,
) -> LoadOutcome:
    """Send the mix open-loop at ``rate`` sessions/s for ``duration_s`` to ``url``.

    ``sessions`` also ends the plan after that many sessions (an agent conversation is one).
    ``class_header=False``: clients name no class (``X-Client-Class``), each class its own
    few clients (API keys), and the sidecar recognises them.
    ``whole_plan`` cuts the plan at ``duration_s`` of *planned* time and sends all of it,
    every turn, however late a busy generator runs: runs that are compared then send the
    same requests.

    The first SIGINT stops new requests and lets those in flight finish; a second SIGINT,
    or SIGTERM, cancels the run (``aborted_by``). Signal handlers are the event loop's
    while this runs; the caller reinstalls its own afterwards.
    """
    from obs.loadgen.driver import Driver, DriverSettings
    from obs.loadgen.plan import Arrivals, bounded, iter_plan
    from obs.loadgen.prompts import CharEstimate, PromptBuilder
    from obs.loadgen.records import RecordWriter

    arrivals = Arrivals(rate=rate)
    settings = DriverSettings(
        run_id=run_id,
        base_url=url,
        duration_s=None if whole_plan else duration_s,
        request_timeout_s=REQUEST_TIMEOUT_S,
        class_header=class_header,
        clients=0 if class_header else UNLABELLED_CLIENTS,
    )
    outcome = LoadOutcome(None, False, None)

    with RecordWriter(records) as writer:

        def on_record(record: Record, gaps_ns: object) -> None:
            writer.write(record)
            view.add(record)

        async def main() -> RunResult:
            driver = Driver(
                settings, mix, PromptBuilder(CharEstimate(), f"{seed}:{run_id}"), on_record
            )
            plan = iter_plan(mix, seed, arrivals)
            if sessions is not None:
                plan = itertools.takewhile(lambda r: r.session < sessions, plan)
            if whole_plan:
                plan = bounded(plan, duration_s=duration_s)
            task = asyncio.ensure_future(driver.run(plan, arrivals))
            return await _watched(task, driver, view, outcome, notice)

        try:
            outcome.result = asyncio.run(main())
        except asyncio.CancelledError:
            if outcome.aborted_by is None:
                raise
    return outcome


async def _watched(
    task: asyncio.Future[RunResult],
    driver: Driver,
    view: LiveView,
    outcome: LoadOutcome,
    notice: Callable[[str], None],
) -> RunResult:
    """Await the run with the signal handlers installed and the live view ticking."""
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if signum == signal.SIGINT and not outcome.stopped_early:
            outcome.stopped_early = True
            notice("stopping the load: no new requests (Ctrl-C again to abort)")
            driver.stop()
            return
        outcome.aborted_by = signum
        task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)

    async def tick() -> None:
        while True:
            view.update(driver.inflight)
            await asyncio.sleep(view.tick_s)

    ticker = asyncio.ensure_future(tick())
    try:
        return await task
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        view.update(driver.inflight, final=True)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
