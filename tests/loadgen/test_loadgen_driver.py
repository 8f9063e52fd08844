"""The load driver end to end against a stand-in OpenAI server on loopback.

STAND-IN, and why: the real engine fixture (``vllm``) and the sidecar are still
being built, and some cases here need a server that a test can instrument (how
many requests were in flight, when its last write to a slow reader returned).
``StandIn`` answers ``/v1/models`` and ``/v1/chat/completions`` in the exact SSE
shape of vLLM 0.32 (shared/reference/vllm-0.32-sse-capture.txt). The same driver
runs against a real ``vllm serve`` in tests/loadgen/test_loadgen_engine.py.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from obs.cli import main as cli_main
from obs.loadgen.driver import Driver, DriverSettings, RunResult
from obs.loadgen.mix import CLASS_NAMES, Mix, load_mix
from obs.loadgen.plan import Arrivals, plan
from obs.loadgen.prompts import CharEstimate, PromptBuilder
from obs.loadgen.records import Record, read_records

pytestmark = pytest.mark.inproc

# Every class but chat off unless a test turns it on; small shapes.
QUIET = [f"{c}.weight=0" for c in ("rag", "long-prefill", "agent", "batch", "slow-stream")]
SMALL = ["chat.prompt_tokens=[8,16]", "chat.max_tokens=[3,5]"]


def only(name: str, *sets: str) -> Mix:
    """A mix of class ``name`` alone, with ``sets`` applied."""
    return load_mix(sets=[*(f"{c}.weight=0" for c in CLASS_NAMES), f"{name}.weight=1", *sets])


@dataclass
class Seen:
    """One request as the stand-in received it."""

    headers: Mapping[str, str]
    body: dict[str, Any]
    started: float
    ended: float = 0.0  # when the last write returned (monotonic)


@dataclass
class StandIn:
    """A stand-in for vLLM's OpenAI API (see the module docstring), served from a thread."""

    token_delay_s: float = 0.0
    chunk_pad: int = 0  # extra characters per token chunk (for backpressure tests)
    small_send_buffer: bool = False
    drop_done: bool = False
    seen: list[Seen] = field(default_factory=list)
    inflight: int = 0
    max_inflight: int = 0
    url: str = ""

    def __post_init__(self) -> None:
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    def __enter__(self) -> StandIn:
        self._thread.start()
        assert self._ready.wait(10), "stand-in server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen = Seen(request.headers.copy(), body, time.monotonic())
        self.seen.append(seen)
        if body.get("model") != "tiny":
            err = {"message": f"The model `{body.get('model')}` does not exist.", "code": 404}
            return web.json_response({"error": err}, status=404)
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            if not body.get("stream"):
                await asyncio.sleep(self.token_delay_s * body["max_tokens"])
                return web.json_response(_completion(body))
            return await self._stream(request, body, seen)
        finally:
            self.inflight -= 1

    async def _stream(self, request: web.Request, body: dict[str, Any], seen: Seen) -> Any:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        if self.small_send_buffer:
            assert request.transport is not None
            request.transport.set_write_buffer_limits(high=1024)
            sock = request.transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        await resp.prepare(request)
        n = body["max_tokens"]
        await resp.write(_sse(_chunk({"role": "assistant", "content": ""}, None)))
        for i in range(n):
            await asyncio.sleep(self.token_delay_s)
            text = "tok" + "x" * self.chunk_pad
            await resp.write(_sse(_chunk({"content": text}, "length" if i == n - 1 else None)))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 11, "completion_tokens": n, "total_tokens": 11 + n}
            await resp.write(_sse({"id": "c", "choices": [], "usage": usage}))
        if not self.drop_done:
            await resp.write(b"data: [DONE]\n\n")
        seen.ended = time.monotonic()
        return resp


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _chunk(delta: dict[str, str], finish: str | None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [choice]}


def _completion(body: dict[str, Any]) -> dict[str, Any]:
    n = body["max_tokens"]
    message = {"role": "assistant", "content": "tok" * n}
    return {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": n, "total_tokens": 11 + n},
    }


@pytest.fixture
def standin() -> Iterator[StandIn]:
    with StandIn() as server:
        yield server


def drive(
    url: str,
    mix: Mix,
    arrivals: Arrivals,
    n: int,
    *,
    seed: int = 1,
    model: str | None = None,
    duration_s: float | None = None,
) -> tuple[RunResult, list[Record]]:
    """Run the plan's first ``n`` requests; return the result and the records."""
    records: list[Record] = []
    settings = DriverSettings(
        run_id="t", base_url=url, model=model, duration_s=duration_s, request_timeout_s=30
    )
    reqs = plan(mix, seed, arrivals, max_requests=n)

    async def run() -> RunResult:
        prompts = PromptBuilder(CharEstimate(), "salt")
        driver = Driver(settings, mix, prompts, lambda r, _gaps: records.append(r))
        return await driver.run(reqs, arrivals)

    return asyncio.run(run()), records


def test_streamed_requests_carry_ids_and_class_headers(standin: StandIn) -> None:
    """Each request sends a unique X-Request-Id and its class as X-Client-Class."""
    mix = load_mix(
        sets=[*QUIET, "rag.weight=40", *SMALL, "rag.document_tokens=50", "rag.max_tokens=3"]
    )
    result, records = drive(standin.url, mix, Arrivals(rate=200), 12)
    assert result.model == "tiny" and result.sent == 12 and result.errors == 0
    ids = [s.headers["X-Request-Id"] for s in standin.seen]
    assert sorted(ids) == sorted(r.request_id for r in records) and len(set(ids)) == 12
    assert {s.headers["X-Client-Class"] for s in standin.seen} <= {"chat", "rag"}
    for s in standin.seen:
        rec = next(r for r in records if r.request_id == s.headers["X-Request-Id"])
        assert s.headers["X-Client-Class"] == rec.client_class
        assert s.body["stream_options"] == {"include_usage": True} and s.body["ignore_eos"]


def test_streamed_record_measures_ttft_itl_and_usage_tokens(standin: StandIn) -> None:
    """A streamed record has TTFT, ITL stats, e2e and tokens taken from usage."""
    standin.token_delay_s = 0.05
    mix = load_mix(sets=[*QUIET, *SMALL])
    _, records = drive(standin.url, mix, Arrivals(rate=100), 2)
    for r in records:
        assert r.status == "ok" and r.http_status == 200 and r.error is None
        assert r.tokens_source == "usage" and r.completion_tokens == r.max_tokens
        assert r.output_chunks == r.max_tokens and r.finish_reason == "length"
        assert r.ttft_ms is not None and r.ttft_ms >= 45
        assert r.itl_p50_ms is not None and r.itl_max_ms is not None
        # A client starved of CPU reads some frames together (gaps near 0): the p50 is not
        # bounded below, but frames 50 ms apart show at least one gap of that order.
        assert 0 <= r.itl_p50_ms <= r.itl_max_ms and r.itl_max_ms >= 45
        assert r.e2e_ms >= r.ttft_ms + (r.max_tokens - 1) * 45
        assert r.prompt_tokens == 11 and r.ts.endswith("Z")


def test_tokens_are_counted_from_chunks_without_usage(standin: StandIn) -> None:
    """With include_usage off, completion tokens are the output chunks counted."""
    mix = load_mix(sets=[*QUIET, *SMALL, "request.include_usage=false"])
    _, records = drive(standin.url, mix, Arrivals(rate=100), 3)
    assert all("stream_options" not in s.body for s in standin.seen)
    assert [(r.tokens_source, r.completion_tokens) for r in records] == [
        ("chunks", r.max_tokens) for r in records
    ]


def test_batch_requests_are_not_streamed(standin: StandIn) -> None:
    """Batch requests ask for a whole answer; the record has no TTFT but has usage tokens."""
    mix = only("batch", "batch.max_tokens=7")
    _, records = drive(standin.url, mix, Arrivals(rate=100), 2, model="tiny")
    assert all(s.body["stream"] is False for s in standin.seen)
    assert all(r.ttft_ms is None and r.completion_tokens == 7 for r in records)
    assert all(r.status == "ok" and r.client_class == "batch" for r in records)


def test_http_errors_are_recorded_with_the_server_message(standin: StandIn) -> None:
    """A 404 from the server gives an error record with the status and message."""
    mix = load_mix(sets=[*QUIET, *SMALL])
    result, records = drive(standin.url, mix, Arrivals(rate=100), 2, model="nope")
    assert result.errors == 2
    assert all(r.status == "error" and r.http_status == 404 for r in records)
    assert all(r.error and "does not exist" in r.error for r in records)


def test_stream_without_done_is_an_error(standin: StandIn) -> None:
    """A stream that ends before data: [DONE] is recorded as an error."""
    standin.drop_done = True
    mix = load_mix(sets=[*QUIET, *SMALL])
    _, records = drive(standin.url, mix, Arrivals(rate=100), 1)
    assert records[0].status == "error" and "[DONE]" in (records[0].error or "")


def test_unreachable_server_fails_loudly() -> None:
    """No server at the URL: resolving the model raises LoadError naming the URL."""
    from obs.loadgen.driver import LoadError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mix = load_mix(sets=[*QUIET, *SMALL])
    with pytest.raises(LoadError, match=f"127.0.0.1:{port}/v1/models"):
        drive(f"http://127.0.0.1:{port}", mix, Arrivals(rate=100), 1)


def test_closed_loop_keeps_the_concurrency(standin: StandIn) -> None:
    """Closed loop with concurrency 2 keeps exactly 2 requests in flight at most."""
    standin.token_delay_s = 0.01
    mix = load_mix(sets=[*QUIET, *SMALL])
    result, records = drive(standin.url, mix, Arrivals(concurrency=2), 8)
    assert result.sent == 8 and standin.max_inflight == 2
    assert all(r.planned_offset_s <= r.offset_s for r in records)


def test_duration_bounds_a_closed_loop(standin: StandIn) -> None:
    """A closed loop stops starting requests once its duration is over."""
    standin.token_delay_s = 0.02
    mix = load_mix(sets=[*QUIET, "chat.max_tokens=5"])
    # 1 s holds several 5-token requests at 20 ms a token even on a loaded machine.
    result, records = drive(standin.url, mix, Arrivals(concurrency=1), 1000, duration_s=1.0)
    assert result.stopped == "duration" and 2 <= result.sent < 1000
    assert max(r.offset_s for r in records) < 1.0


def test_duration_bounds_an_open_loop(standin: StandIn) -> None:
    """Open loop: no request starts after the duration, and the result says why it stopped."""
    mix = load_mix(sets=[*QUIET, *SMALL])
    result, records = drive(standin.url, mix, Arrivals(rate=40), 1000, duration_s=0.4)
    assert result.stopped == "duration" and 3 <= result.sent < 100
    assert max(r.planned_offset_s for r in records) < 0.4


def test_agent_turns_run_in_order_after_think_time(standin: StandIn) -> None:
    """Agent turns go one after another, a think time apart, resending the growing context."""
    mix = only(
        "agent",
        "agent.turns=3",
        "agent.think_time_s=0.1",
        "agent.context_tokens=20",
        "agent.prompt_tokens=5",
        "agent.max_tokens=3",
    )
    _, records = drive(standin.url, mix, Arrivals(rate=1000), 3)
    assert [r.turn for r in records] == [0, 1, 2] and len({r.session for r in records}) == 1
    bodies = [s.body["messages"] for s in standin.seen]
    for earlier, later in itertools.pairwise(bodies):
        assert later[: len(earlier)] == earlier and len(later) == len(earlier) + 2
    for prev, nxt in zip(standin.seen, standin.seen[1:], strict=False):
        assert nxt.started - prev.ended >= 0.09


def test_slow_reader_backpressure_reaches_the_server() -> None:
    """A slow-stream reader at 80 KB/s holds the server's writes back; a fast reader does not."""
    pace = ["slow-stream.read_bytes_per_s=80000", "slow-stream.read_chunk_bytes=1024"]
    spans = {}
    for name in ("slow-stream", "chat"):
        mix = only(name, f"{name}.max_tokens=80", *pace)
        with StandIn(chunk_pad=1000, small_send_buffer=True) as server:
            _, records = drive(server.url, mix, Arrivals(rate=100), 1)
        rec, seen = records[0], server.seen[0]
        assert rec.status == "ok" and rec.bytes_received > 80_000
        spans[name] = (seen.ended - seen.started, rec.e2e_ms)
    slow_writes, slow_e2e = spans["slow-stream"]
    assert slow_e2e >= 900  # read at the configured rate
    assert slow_writes >= 0.5  # the server's writes waited for the reader
    assert spans["chat"][0] < slow_writes / 2


def test_cli_runs_a_load_and_prints_the_summary(
    standin: StandIn, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`vllm-obs load` writes one record per request and a per-class summary table."""
    out = tmp_path / "records.jsonl"
    args = ["load", "--url", standin.url, "--requests", "5", "--rate", "100", "--seed", "4"]
    args += ["--out", str(out), "--run-id", "cli", "--no-progress"]
    args += [arg for s in [*QUIET, *SMALL] for arg in ("--set", s)]
    assert cli_main(args) == 0
    records = read_records(out)
    assert [r.request_id for r in sorted(records, key=lambda r: r.index)] == [
        f"cli-{i:06d}" for i in range(5)
    ]
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:4] == ["class", "n", "err", "ttft"]
    assert any(line.startswith("chat") for line in table.splitlines())


def test_cli_dry_run_prints_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    """`vllm-obs load --dry-run` prints the seeded plan as JSONL and sends nothing."""
    assert cli_main(["load", "--dry-run", "--requests", "4", "--seed", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [orjson.loads(line)["index"] for line in lines] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "0"], "--concurrency must be >= 1"),
        (["--rate", "0"], "--rate must be positive"),
        (["--requests", "0"], "--requests must be >= 1"),
        (["--burst", "10:x:2"], "expected EVERY:LENGTH:FACTOR"),
        (["--concurrency", "2", "--burst", "10:1:2"], "bursts need an open-loop rate"),
        (["--set", "chat.weight"], "expected CLASS.FIELD=VALUE"),
    ],
)
def test_cli_rejects_bad_options_with_status_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad load options exit 2 with a message naming the flag."""
    assert cli_main(["load", "--dry-run", *args]) == 2
    assert message in capsys.readouterr().err
