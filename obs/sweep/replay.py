"""The stress replay: a profile's lanes over simulated GPU pools, in virtual time.

Each planned request of the mix (obs.loadgen's seeded plan: the same arrivals,
classes and lengths ``vllm-obs load`` sends) goes the way the sidecar takes it, with
the sidecar's own code: classified by ``obs.lanes.Classifier`` on the attributes the
relay computes (route, stream, the ``x-client-class`` header the load sets, the
~4-characters-per-token prompt estimate), admitted by
``obs.sidecar.policy.admission.LaneGate`` (concurrency, bounded queue with its timeout,
token budget), routed by ``obs.sidecar.pools.pools.PoolSet.candidates`` (least
outstanding or prefix affinity), then
served by a simulated replica (obs.sweep.virtual). The first-token timeout of the
lane aborts the request as the relay does. Each request becomes one request event
(obs.events), so the matrix comes from the query engine's goodput code, as for a
real sweep. What is *not* replayed: HTTP, the relay's byte path, the exporters.

Admission is the profile's ``admission`` (obs.sweep.capacity): by default each lane's
limit is sized from its pools' capacity (Little's law at capacity); ``shared`` gives each
pool one gate for all its lanes; ``lanes`` keeps the lanes' blocks as written. A pool's
``prefix_caching: false`` turns its replicas' prefix cache off, and its
``stream_interval: N`` sends tokens N to a chunk (the first at once): the event's chunks
and inter-token gaps are the client's. ``scale`` multiplies every modelled step time
(the stress's calibration band).

Lanes with a traffic split, a fallback pool or priorities are refused (not replayed yet).
Slow readers (``read_bytes_per_s``) hold their admission slot until they have read
the whole answer (``SSE_BYTES_PER_TOKEN`` per token); the lane's slow-client buffer
frees the pool at once, as the sidecar's does.
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from obs.config import Config, Lane
from obs.engines.sim.api import TOKENS_PER_MESSAGE
from obs.engines.sim.hardware import PerfModel, with_calibration
from obs.engines.sim.scheduler import SchedulerConfig, SimRequest
from obs.errors import ConfigError
from obs.events import Event
from obs.lanes import Classifier
from obs.loadgen.mix import Mix
from obs.loadgen.plan import Arrivals, PlannedRequest, iter_plan
from obs.sidecar.outcomes import Refusal
from obs.sidecar.policy.admission import LaneGate, Ticket, cost_of
from obs.sidecar.pools.pools import PoolSet
from obs.sweep.capacity import MODEL, ROUTE, SSE_BYTES_PER_TOKEN, Sizing, request_attrs, size
from obs.sweep.profile import Profile
from obs.sweep.virtual import VirtualLoop, VirtualReplica, gap_percentile

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(slots=True)
class ReplayResult:
    profile: str
    requests: int
    virtual_s: float
    engine_steps: int
    events: Path


def _blocks(kind: str, key: int, tokens: int, block_size: int) -> list[int]:
    return [hash((kind, key, i)) for i in range(tokens // block_size)]


def scaled(perf: PerfModel, factor: float) -> PerfModel:
    """``perf`` with every step ``factor`` times as long (efficiencies divided, CPU costs
    and all-reduce latency multiplied; the links' bytes are not)."""
    c = perf.cal
    cal = replace(
        c,
        mfu=c.mfu / factor,
        mbu=c.mbu / factor,
        step_s=c.step_s * factor,
        seq_s=c.seq_s * factor,
        token_s=c.token_s * factor,
        allreduce_s=c.allreduce_s * factor,
    )
    return with_calibration(perf, cal)


def chunk_gaps(gaps: list[tuple[float, int]], n: int) -> list[tuple[float, int]]:
    """Inter-token gaps as (seconds, how many) when tokens are sent ``n`` to a chunk: each
    chunk's gap is the sum of its ``n`` tokens' gaps (a last partial chunk sums fewer)."""
    if n <= 1:
        return gaps
    out: list[tuple[float, int]] = []
    acc, count = 0.0, 0
    for gap, k in gaps:
        if count:  # finish the open chunk
            take = min(k, n - count)
            acc, count, k = acc + take * gap, count + take, k - take
            if count == n:
                out.append((acc, 1))
                acc, count = 0.0, 0
        if k >= n:
            out.append((gap * n, k // n))
            k %= n
        if k:
            acc, count = acc + k * gap, count + k
    if count:
        out.append((acc, 1))
    return out


class Replay:
    def __init__(
        self,
        profile: Profile,
        mix: Mix,
        out: Path,
        block_size: int = 16,
        scale: float = 1.0,
        sizing: Sizing | None = None,
    ) -> None:
        self.profile = profile
        self.mix = mix
        self.block_size = block_size
        self.loop = VirtualLoop()
        urls = {}
        self.replicas: dict[str, VirtualReplica] = {}
        self.stream_interval: dict[str, int] = {}
        for pool, flags in profile.gpu_pools().items():
            self.stream_interval[pool] = flags.stream_interval or 1
            urls[pool] = [f"http://sim-{pool}-{i}" for i in range(flags.replicas)]
            sched = SchedulerConfig(
                max_num_batched_tokens=flags.max_num_batched_tokens or 8192,
                max_num_seqs=flags.max_num_seqs or 256,
                long_prefill_token_threshold=flags.long_prefill_token_threshold or 0,
            )
            perf = scaled(flags.perf(), scale)
            for url in urls[pool]:
                self.replicas[url] = VirtualReplica(
                    self.loop,
                    perf,
                    sched,
                    block_size,
                    flags.kv_blocks,
                    prefix_caching=flags.prefix_caching,
                )
        self.config: Config = profile.config.model_validate(
            profile.lanes_config(urls, engine="sim")
        )
        for lane in self.config.lanes:
            if lane.split or lane.fallback or lane.priority:
                raise ConfigError(
                    f"{profile.source}: lane {lane.name!r} has a traffic split, fallback or "
                    "priority, which the stress replay does not replay (yet)"
                )
        self.classifier = Classifier(self.config)
        self.sizing = sizing or size(profile, mix)
        admitted = self.sizing.lanes(self.config, profile.admission)
        self.admission = {name: lane.admission for name, lane in admitted.items()}
        if profile.admission == "shared":  # one gate per pool, for all its lanes
            by_pool: dict[str, LaneGate] = {}
            self.gates = {
                lane.name: by_pool.setdefault(lane.pool, LaneGate(admitted[lane.name]))
                for lane in self.config.lanes
            }
        else:
            self.gates = {name: LaneGate(lane) for name, lane in admitted.items()}
        self.pools = PoolSet(self.config)
        self.out = out
        self.sent = 0
        self.recorded = 0
        self.failures: list[BaseException | None] = []
        self._writer: gzip.GzipFile | None = None

    # ---- the run -------------------------------------------------------------------

    def run(self, requests: int, rate: float, seed: int) -> ReplayResult:
        """Replay the first ``requests`` planned requests at ``rate`` sessions/s."""
        plan = itertools.islice(iter_plan(self.mix, seed, Arrivals(rate=rate)), requests)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(self.out, "wb", compresslevel=1) as writer:
            self._writer = writer
            try:
                self.loop.run_until_complete(self._feed(plan))
            finally:
                self._writer = None
                self.loop.close()
        if self.failures:
            raise RuntimeError(f"the replay lost {len(self.failures)} request(s)") from (
                self.failures[0]
            )
        steps = sum(r.steps for r in self.replicas.values())
        return ReplayResult(self.profile.name, self.recorded, self.loop.now, steps, self.out)

    async def _feed(self, plan: Iterator[PlannedRequest]) -> None:
        tasks: set[asyncio.Task[None]] = set()

        def done(task: asyncio.Task[None]) -> None:
            tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                self.failures.append(task.exception())

        for session, turns in itertools.groupby(plan, key=lambda p: p.session):
            turns_list = list(turns)
            delay = turns_list[0].offset_s - self.loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            task = self.loop.create_task(self._session(session, turns_list))
            tasks.add(task)
            task.add_done_callback(done)
        while tasks:
            await asyncio.gather(*list(tasks))

    async def _session(self, session: int, turns: list[PlannedRequest]) -> None:
        for p in turns:
            if p.turn > 0:
                await asyncio.sleep(p.think_s)
            await self._one(p)

    # ---- one request, as the sidecar handles it ---------------------------------------

    async def _one(self, p: PlannedRequest) -> None:
        received = self.loop.time()
        self.sent += 1
        attrs, messages = request_attrs(p)
        estimate = attrs.prompt_tokens
        lane = self.classifier.classify(attrs)
        gate = self.gates[lane.name]
        event = Event(
            request_id=f"stress-{p.index}",
            model=MODEL,
            lane=lane.name,
            pool=lane.pool,
            route=ROUTE,
            stream=p.stream,
            max_tokens=p.max_tokens,
        )
        ticket = Ticket("default", cost_of(estimate, p.max_tokens))
        r = gate.check(estimate, p.max_tokens) or await gate.admit(ticket)
        if isinstance(r, Refusal):
            self._record(event, received, status="rejected", http=r.status, reason=r.reason)
            return
        try:
            await self._serve(p, lane, event, received, messages)
        finally:
            gate.release(ticket)

    async def _serve(
        self, p: PlannedRequest, lane: Lane, event: Event, received: float, messages: int
    ) -> None:
        dispatched = self.loop.time()
        affinity = None
        if lane.routing == "prefix_affinity":
            affinity = f"{p.client_class}:{p.document if p.document is not None else p.session}"
            if p.client_class not in ("rag", "agent"):
                affinity = f"{p.index}"
        replica = self.pools.candidates(lane.pool, affinity)[0]
        engine = self.replicas[replica.url]
        event.replica = replica.url
        prompt = p.total_prompt_tokens + TOKENS_PER_MESSAGE * messages + 1
        if p.document is not None:
            hashes = _blocks("doc", p.document, p.prefix_tokens, self.block_size)
        elif p.client_class == "agent":
            shared = p.total_prompt_tokens - p.prompt_tokens
            hashes = _blocks("agent", p.session, shared, self.block_size)
        else:
            hashes = []
        req = SimRequest(f"r{p.index}", prompt, p.max_tokens, hashes)
        with replica.lease():
            fut = engine.submit(req)
            timer = self.loop.call_at(
                dispatched + lane.timeouts.first_token_s, self._first_token_due, engine, req, fut
            )
            try:
                await fut
            except (RuntimeError, TimeoutError) as e:
                timed_out = isinstance(e, TimeoutError)
                self._record(
                    event,
                    received,
                    status="error",
                    http=504 if timed_out else 500,
                    error="upstream_timeout" if timed_out else "upstream_status",
                    queue_s=dispatched - received,
                )
                return
            finally:
                timer.cancel()
        assert req.first_token_s is not None and req.finished_s is not None
        end = req.finished_s
        spec = self.mix.spec(p.client_class)
        rate = getattr(spec, "read_bytes_per_s", None)
        if p.stream and rate:
            end = max(end, req.first_token_s + req.output * SSE_BYTES_PER_TOKEN / rate)
            if end > self.loop.time():
                await asyncio.sleep(end - self.loop.time())
        self._record(
            event, received, status="ok", http=200, req=req, end=end, dispatched=dispatched
        )

    def _first_token_due(
        self, engine: VirtualReplica, req: SimRequest, fut: asyncio.Future[SimRequest]
    ) -> None:
        if req.first_token_s is None and not fut.done():
            engine.abort(req)
            fut.set_exception(TimeoutError())

    # ---- the event ------------------------------------------------------------------

    def _record(
        self,
        event: Event,
        received: float,
        *,
        status: str,
        http: int,
        reason: str | None = None,
        error: str | None = None,
        queue_s: float | None = None,
        req: SimRequest | None = None,
        end: float | None = None,
        dispatched: float | None = None,
    ) -> None:
        now = self.loop.time()
        event.ts = (EPOCH + timedelta(seconds=received)).isoformat(timespec="milliseconds")
        event.status, event.http_status = status, http
        event.rejection_reason = reason
        event.error_class = error
        if status == "rejected":
            event.error_class = "admission"
        event.e2e_ms = (now - received) * 1000
        if queue_s is not None:
            event.queue_ms = queue_s * 1000
        if req is not None and end is not None and dispatched is not None:
            assert req.first_token_s is not None and req.finished_s is not None
            first = req.first_token_s
            event.prompt_tokens = req.prompt_tokens
            event.completion_tokens = req.output
            event.tokens_source = "usage"
            event.finish_reason = "length"
            event.cached_tokens = req.cached_tokens
            event.cache_hit = req.cached_tokens > 0
            event.queue_ms = (dispatched - received) * 1000
            event.prefill_ms = (first - dispatched) * 1000
            event.e2e_ms = (end - received) * 1000
            interval = self.stream_interval.get(event.pool or "", 1)
            event.output_chunks = 1 + -(-(req.output - 1) // interval)
            if event.stream:
                event.ttft_ms = (first - received) * 1000
                event.decode_ms = (req.finished_s - first) * 1000
                event.stream_ms = (end - req.finished_s) * 1000
                if req.output > 1:
                    event.tpot_ms = (req.finished_s - first) * 1000 / (req.output - 1)
                gaps = chunk_gaps(req.gaps, interval)
                if gaps:  # as sent: a slow reader's own pace is its stream_ms
                    event.itl_p50_ms = round(gap_percentile(gaps, 0.5) * 1000, 3)
                    event.itl_p95_ms = round(gap_percentile(gaps, 0.95) * 1000, 3)
                    event.itl_max_ms = round(max(g for g, _ in gaps) * 1000, 3)
            else:
                event.ttft_ms = (req.finished_s - received) * 1000
        assert self._writer is not None
        self._writer.write(event.to_json())
        self.recorded += 1
