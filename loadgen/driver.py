"""The driver: sends a plan's requests over HTTP and measures what the client sees.

I/O lives here and nowhere else in the package. Open loop, each session starts
at its planned offset whatever the server is doing (a ``max_inflight`` cap is
the only brake, and any lag it causes shows as ``offset_s - planned_offset_s``);
closed loop, ``concurrency`` workers each run one session after another. No
request starts after the duration; requests in flight then run to completion.
Agent turns go in order, each ``think_s`` after the previous one ended; a failed
turn ends its conversation.

Slow readers get their own connection pool with a small socket receive buffer and a
small aiohttp read buffer, and read at their configured rate: the client's buffers fill,
the TCP window closes, and the server's writes block, as with a real slow client.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson

from obs.errors import ObsError
from obs.loadgen.clients import Clients, build_body
from obs.loadgen.measure import Measurement
from obs.loadgen.mix import Mix
from obs.loadgen.plan import SESSION_HEADER, Arrivals, PlannedRequest, sessions
from obs.loadgen.prompts import PromptBuilder
from obs.loadgen.records import Record
from obs.loadgen.sse import SSEParser, error_message, parse_chunk

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
NS = 1_000_000_000
KEEPALIVE_S = 4.0  # idle connections dropped after this: below the servers' 5 s (docs/load.md)

OnRecord = Callable[[Record, Sequence[int]], None]


class LoadError(ObsError):
    """The load run could not start (server unreachable, no model, ...)."""


@dataclass(frozen=True, slots=True)
class DriverSettings:
    """Where and how to send; everything the driver needs besides the plan."""

    run_id: str
    base_url: str = DEFAULT_BASE_URL
    model: str | None = None  # None: the first model GET /v1/models lists
    duration_s: float | None = None
    request_timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    max_inflight: int = 1000
    api_key: str | None = None
    slow_rcvbuf_bytes: int = 4096  # SO_RCVBUF of slow readers' sockets
    class_header: bool = True  # send X-Client-Class (obs.loadgen.clients)
    clients: int = 0  # simulated clients per class, each its own key; 0: one identity


@dataclass(frozen=True, slots=True)
class ReadRate:
    """How fast a slow client reads: bytes/s or SSE events/s, ``chunk_bytes`` per read."""

    bytes_per_s: float | None
    events_per_s: float | None
    chunk_bytes: int


@dataclass(frozen=True, slots=True)
class RunResult:
    run_id: str
    model: str
    started: str  # wall clock, ISO 8601 UTC
    wall_s: float
    sent: int
    errors: int
    stopped: str  # "done" (plan exhausted), "duration" or "interrupted"


def api_root(base_url: str) -> str:
    """``http://host:port`` from a base URL given with or without ``/v1``."""
    return base_url.rstrip("/").removesuffix("/v1")


def iso_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def read_rate(mix: Mix) -> ReadRate:
    spec = mix.classes.slow_stream
    return ReadRate(spec.read_bytes_per_s, spec.read_events_per_s, spec.read_chunk_bytes)


async def resolve_model(session: aiohttp.ClientSession, root: str, headers: dict[str, str]) -> str:
    """The first model ``GET /v1/models`` lists."""
    url = f"{root}/v1/models"
    try:
        async with session.get(url, headers=headers) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise LoadError(f"GET {url}: HTTP {resp.status}: {error_message(_json(raw))}")
            data = _json(raw)
    except (aiohttp.ClientError, TimeoutError) as e:
        raise LoadError(f"GET {url}: {type(e).__name__}: {e}") from e
    models = data.get("data") if isinstance(data, dict) else None
    if not models or not isinstance(models[0], dict) or "id" not in models[0]:
        raise LoadError(f"GET {url}: no model listed; give --model")
    return str(models[0]["id"])


def _json(raw: bytes) -> object:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace")


def _connector(rcvbuf: int | None = None) -> aiohttp.TCPConnector:
    """Idle connections kept ``KEEPALIVE_S``; with ``rcvbuf``, sockets with that receive buffer,
    one per request: a slow reader finishes reading long after the server sent the last byte
    and started its keep-alive clock, so the connection it would pool may already be closed
    (the next request then fails to write, and never reaches the server)."""
    if rcvbuf is None:
        return aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)

    def factory(addr_info: Any) -> socket.socket:
        sock = socket.socket(family=addr_info[0], type=addr_info[1], proto=addr_info[2])
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        return sock

    return aiohttp.TCPConnector(limit=0, force_close=True, socket_factory=factory)


class Driver:
    """Runs one load run. ``on_record`` gets each record and its raw ITL gaps (ns)."""

    def __init__(
        self,
        settings: DriverSettings,
        mix: Mix,
        prompts: PromptBuilder,
        on_record: OnRecord,
        *,
        clock: Callable[[], int] = time.perf_counter_ns,
        wall: Callable[[], str] = iso_now,
    ) -> None:
        self.settings = settings
        self._mix = mix
        self._prompts = prompts
        self._on_record = on_record
        self._clock = clock
        self._wall = wall
        self._rate = read_rate(mix)
        self._root = api_root(settings.base_url)
        self._headers = {"Content-Type": "application/json"}
        if settings.api_key:
            self._headers["Authorization"] = f"Bearer {settings.api_key}"
        self.model = settings.model or ""
        self._clients = Clients(
            mix,
            settings.run_id,
            class_header=settings.class_header,
            clients=settings.clients,
            api_key=bool(settings.api_key),
        )
        self.sent = 0
        self.errors = 0
        self.inflight = 0
        self._start_ns = 0
        self._stop = asyncio.Event()
        self._stopped = "done"
        self._slots = asyncio.Semaphore(settings.max_inflight)
        self._sessions: dict[str, aiohttp.ClientSession] = {}

    def stop(self) -> None:
        """Start no more requests; those in flight run to completion."""
        self._stopped = "interrupted"
        self._stop.set()

    def elapsed_s(self) -> float:
        return (self._clock() - self._start_ns) / NS if self._start_ns else 0.0

    async def run(self, requests: Iterable[PlannedRequest], arrivals: Arrivals) -> RunResult:
        """Send the planned requests; returns when all have ended."""
        s = self.settings
        timeout = aiohttp.ClientTimeout(total=s.request_timeout_s, sock_connect=s.connect_timeout_s)
        fast = aiohttp.ClientSession(connector=_connector(), timeout=timeout)
        slow = aiohttp.ClientSession(
            connector=_connector(s.slow_rcvbuf_bytes),
            timeout=timeout,
            read_bufsize=self._rate.chunk_bytes,
        )
        async with fast, slow:
            self._sessions = {"fast": fast, "slow": slow}
            if not self.model:
                self.model = await resolve_model(fast, self._root, self._headers)
            started = self._wall()
            self._start_ns = self._clock()
            if arrivals.concurrency is not None:
                await self._closed_loop(sessions(requests), arrivals.concurrency)
            else:
                await self._open_loop(sessions(requests))
            wall_s = self.elapsed_s()
        return RunResult(
            s.run_id, self.model, started, wall_s, self.sent, self.errors, self._stopped
        )

    def _halt(self, at_s: float | None = None) -> bool:
        """Whether to start nothing more (now, or at offset ``at_s``); notes why."""
        if self._stop.is_set():
            return True
        d = self.settings.duration_s
        if d is not None and (self.elapsed_s() if at_s is None else at_s) >= d:
            self._stopped = "duration"
            return True
        return False

    async def _wait(self, seconds: float) -> None:
        """Sleep, but wake at once when stopped."""
        if seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), seconds)

    async def _open_loop(self, planned: Iterable[list[PlannedRequest]]) -> None:
        tasks: set[asyncio.Task[None]] = set()
        for turns in planned:
            if self._halt(turns[0].offset_s):  # arrives after the duration: don't wait for it
                break
            await self._wait(turns[0].offset_s - self.elapsed_s())
            if self._halt():
                break
            task = asyncio.create_task(self._session(turns, turns[0].offset_s))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)

    async def _closed_loop(self, planned: Iterable[list[PlannedRequest]], workers: int) -> None:
        it = iter(planned)

        async def worker() -> None:
            for turns in it:  # one shared iterator: each session goes to one worker
                if self._halt():
                    return
                await self._session(turns, self.elapsed_s())

        await asyncio.gather(*(worker() for _ in range(workers)))

    async def _session(self, turns: list[PlannedRequest], due_s: float) -> None:
        for req in turns:
            if req.turn:
                await self._wait(req.think_s)
                due_s = self.elapsed_s()
            if self._halt():
                return
            record = await self._request(req, due_s)
            if record.status != "ok":
                return

    async def _request(self, req: PlannedRequest, due_s: float) -> Record:
        who = self._clients.client(req)
        async with self._clients.turn(who), self._slots:
            # Prompt text is CPU work (and tokenizer calls): off the loop that times the streams.
            body = await asyncio.to_thread(self._body, req)
            headers = {
                **self._headers,
                "X-Request-Id": f"{self.settings.run_id}-{req.index:06d}",
                SESSION_HEADER: f"{self.settings.run_id}-{req.session}",
                **self._clients.headers(req, who),
            }
            slow = req.client_class == "slow-stream"
            session = self._sessions["slow" if slow else "fast"]
            ts = self._wall()
            m = Measurement(self._clock())
            self.inflight += 1
            http_status = None
            try:
                url = f"{self._root}/v1/chat/completions"
                async with session.post(url, data=body, headers=headers) as resp:
                    http_status = resp.status
                    if resp.status != 200:
                        raw = await resp.read()
                        m.bytes_received = len(raw)
                        m.error = f"HTTP {resp.status}: {error_message(_json(raw))}"
                    elif req.stream:
                        await self._read_stream(resp.content, m, self._rate if slow else None)
                    else:
                        raw = await resp.read()
                        m.bytes_received = len(raw)
                        obj = orjson.loads(raw)
                        if not isinstance(obj, dict):
                            raise ValueError("response body is not a JSON object")
                        m.body(obj)
            except TimeoutError:
                m.error = (
                    f"timeout: no complete answer within {self.settings.request_timeout_s:g} s"
                )
            except aiohttp.ClientError as e:
                m.error = f"{type(e).__name__}: {e}"
            except ValueError as e:
                m.error = f"bad response: {e}"
            finally:
                self.inflight -= 1
            m.end_ns = self._clock()
        record = self._record(req, m, ts, due_s, http_status)
        record.client = who
        self.sent += 1
        self.errors += record.status != "ok"
        self._on_record(record, m.gaps_ns)
        return record

    def _body(self, req: PlannedRequest) -> bytes:
        messages = self._prompts.messages(req)
        tools = self._mix.classes.agent.tools
        return orjson.dumps(build_body(req, messages, self.model, self._mix.request, tools))

    async def _read_stream(
        self, content: aiohttp.StreamReader, m: Measurement, rate: ReadRate | None
    ) -> None:
        parser = SSEParser()
        done = False
        due = self._clock()  # a slow link carries no credit across the server's silences
        while True:
            data = await (content.read(rate.chunk_bytes) if rate else content.readany())
            if not data:
                break
            due = max(due, self._clock())
            m.bytes_received += len(data)
            for payload in parser.feed(data):
                chunk = parse_chunk(payload)
                if chunk is None:
                    done = True
                else:
                    m.chunk(chunk, self._clock())
                if rate and rate.events_per_s:
                    due += int(NS / rate.events_per_s)
                    await self._sleep_until(due)
            if rate and rate.bytes_per_s:
                due += int(len(data) * NS / rate.bytes_per_s)
                await self._sleep_until(due)
        for payload in parser.close():
            chunk = parse_chunk(payload)
            done = done or chunk is None
            if chunk is not None:
                m.chunk(chunk, self._clock())
        if not done and m.error is None:
            m.error = "stream ended without [DONE]"

    async def _sleep_until(self, t_ns: int) -> None:
        delay = (t_ns - self._clock()) / NS
        if delay > 0:
            await asyncio.sleep(delay)

    def _record(
        self, req: PlannedRequest, m: Measurement, ts: str, due_s: float, http_status: int | None
    ) -> Record:
        return Record(
            run_id=self.settings.run_id,
            request_id=f"{self.settings.run_id}-{req.index:06d}",
            client_class=req.client_class,
            index=req.index,
            session=req.session,
            turn=req.turn,
            ts=ts,
            offset_s=round((m.start_ns - self._start_ns) / NS, 6),
            planned_offset_s=round(due_s, 6),
            model=self.model,
            stream=req.stream,
            prompt_tokens_planned=req.total_prompt_tokens,
            max_tokens=req.max_tokens,
            status="ok" if m.error is None else "error",
            http_status=http_status,
            error=m.error,
            **m.fields(),
        )


def run_load(
    settings: DriverSettings,
    mix: Mix,
    prompts: PromptBuilder,
    requests: Iterable[PlannedRequest],
    arrivals: Arrivals,
    on_record: OnRecord,
) -> RunResult:
    """Run a load synchronously (a fresh event loop); see :class:`Driver`."""

    async def main() -> RunResult:
        return await Driver(settings, mix, prompts, on_record).run(requests, arrivals)

    return asyncio.run(main())
