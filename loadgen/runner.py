"""Wires one ``vllm-obs load`` run: mix -> plan -> driver -> records, summary, check."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TextIO

import orjson

from obs.errors import ConfigError
from obs.loadgen.check import check_files
from obs.loadgen.driver import Driver, DriverSettings, RunResult
from obs.loadgen.mix import load_mix
from obs.loadgen.plan import Arrivals, Burst, PlannedRequest, bounded, iter_plan
from obs.loadgen.progress import Progress
from obs.loadgen.prompts import CharEstimate, HFTokenizer, PromptBuilder, Sizer
from obs.loadgen.records import Record, RecordWriter
from obs.loadgen.summary import SummaryBuilder, render_table

if TYPE_CHECKING:
    from obs.loadgen.cli import LoadOptions

PROGRESS_TICK_S = 0.5


def run_command(
    opts: LoadOptions, *, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """Run a load as the CLI asked; 1 when every request failed or the check finds gaps."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    mix = load_mix(opts.mix_path, opts.sets)
    arrivals = Arrivals(
        rate=None if opts.concurrency else opts.rate,
        concurrency=opts.concurrency,
        burst=Burst(*opts.burst) if opts.burst else None,
    )
    # The driver enforces the duration (and says so); the plan is cut by count only.
    requests = bounded(iter_plan(mix, opts.seed, arrivals), max_requests=opts.max_requests)
    if opts.dry_run:
        if arrivals.closed and opts.max_requests is None:
            raise ConfigError("--dry-run of a closed loop needs --requests (its plan is unbounded)")
        for req in bounded(requests, duration_s=opts.duration_s):
            stdout.write(orjson.dumps(req, option=orjson.OPT_APPEND_NEWLINE).decode())
        return 0

    sizer: Sizer = HFTokenizer(opts.tokenizer) if opts.tokenizer else CharEstimate()
    settings = DriverSettings(
        run_id=opts.run_id,
        base_url=opts.url,
        model=opts.model,
        duration_s=opts.duration_s,
        request_timeout_s=opts.timeout_s,
        max_inflight=opts.max_inflight,
        api_key=opts.api_key,
        class_header=opts.class_header,
        clients=opts.clients,
    )
    loop = (
        f"closed loop, {arrivals.concurrency} at a time"
        if arrivals.closed
        else f"open loop, {arrivals.rate:g}/s"
    )
    print(
        f"load {opts.run_id}: {loop} to {opts.url}; token lengths {sizer.description}; "
        f"records -> {opts.out}",
        file=stderr,
    )
    summary = SummaryBuilder()
    progress = Progress(
        stderr, total=opts.max_requests, duration_s=opts.duration_s, enabled=opts.progress
    )
    with RecordWriter(opts.out) as writer:

        def on_record(record: Record, gaps_ns: Sequence[int]) -> None:
            writer.write(record)
            summary.add(record, gaps_ns)

        result = asyncio.run(
            _drive(
                lambda: Driver(
                    settings, mix, PromptBuilder(sizer, f"{opts.seed}:{opts.run_id}"), on_record
                ),
                requests,
                arrivals,
                progress,
            )
        )
    progress.close()
    print(render_table(summary.build(result.wall_s)), file=stdout)
    print(
        f"{result.sent} requests, {result.errors} errors in {result.wall_s:.1f} s "
        f"(model {result.model}, stopped: {result.stopped}); records: {opts.out}",
        file=stderr,
    )
    status = 1 if result.sent and result.errors == result.sent else 0
    if opts.check_events is not None:
        report = check_files(opts.out, opts.check_events, wait_s=opts.check_wait_s)
        print(report.render(), file=stdout)
        status = status or (0 if report.ok else 1)
    return status


async def _drive(
    make_driver: Callable[[], Driver],
    requests: Iterable[PlannedRequest],
    arrivals: Arrivals,
    progress: Progress,
) -> RunResult:
    driver = make_driver()
    _stop_on_first_interrupt(driver.stop)

    async def tick() -> None:
        while True:
            progress.update(driver.sent, driver.errors, driver.inflight, force=True)
            await asyncio.sleep(PROGRESS_TICK_S)

    ticker = asyncio.create_task(tick()) if progress.enabled else None
    try:
        return await driver.run(requests, arrivals)
    finally:
        if ticker is not None:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            progress.update(driver.sent, driver.errors, driver.inflight, force=True)


def _stop_on_first_interrupt(stop: Callable[[], None]) -> None:
    """First Ctrl-C: start no new requests and let those in flight end; second: abort."""
    loop = asyncio.get_running_loop()

    def first() -> None:
        loop.remove_signal_handler(signal.SIGINT)
        print(
            "\nstopping: no new requests, waiting for those in flight (Ctrl-C again to abort)",
            file=sys.stderr,
        )
        stop()

    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        loop.add_signal_handler(signal.SIGINT, first)
