"""Where an SLO miss came from: the phase and the cause of each request that missed a gate.

A request **misses** a gate of its lane (the rules of ``obs.query.slo``, in Python here):

* ``ttft``: the lane declares a TTFT SLO and the request's TTFT value (``ttft_ms``, or, for a
  successful non-streamed request, ``e2e_ms``) is above its threshold;
* ``tpot``: the lane declares a TPOT SLO and ``tpot_ms`` is above its threshold;
* ``availability``: the lane declares an availability SLO and the request failed for a
  server-side reason (status in ``BAD_OUTCOMES``).

Each missed gate is attributed to a **phase** and a **cause** (``MISS_CAUSES``), by this rule:

1. **Phase.** An availability miss is charged to the phase the request failed in
   (``error_phase``). A latency miss is charged to the phase, among those that make up the
   gate's value, with the largest excess over what the lane's good requests take in that
   phase on average (the ``Baseline``): TTFT is queue + prefill + first_token (a non-streamed
   request's e2e: every phase); TPOT is first_token + decode (the cadence upstream). Ties go
   to the earlier phase.
2. **Cause**, the first that holds (the pool-state factors, ``AHEAD_FACTOR`` and
   ``BUSY_FACTOR``, and the rules reading them live in ``obs.engine_queue``):

   * an availability miss: ``slow_client`` when the relay ended the stream on a client that
     read nothing (``error_class`` slow_client); ``upstream_error`` when the pool refused,
     failed or timed out (``upstream_*``, or no replica accepting connections); else
     ``other``;
   * phase ``queue``: the engine's queue when the engine's wait (``engine_queue_ms``: its
     span's, or, with no span, the estimate of ``obs.engine_queue`` from the pool's state at
     dispatch, ``engine_view: inferred``) beyond the lane's good requests' (0 for one that
     waited for no slot) took at least half of the queue's excess; then named by what the
     pool's state at dispatch says filled the engine: ``kv_pressure`` when its KV cache was
     near full or it was preempting, ``prefills_ahead`` when the requests in flight ahead
     carried prompts longer than usual (``obs.engine_queue.longer_than_usual``: per request,
     at least ``AHEAD_FACTOR`` times what the lane's good requests found ahead of them, in
     the same estimate, and further above that than this one's prompt is above the lane's),
     else ``engine_queue`` (requests of ordinary size filled the slots); without that wait,
     ``admission_queue`` (the time from arrival to dispatch is the lane's admission gate
     and the connect);
   * phase ``prefill``: ``long_prefill`` when the prompt has at least
     ``LONG_PROMPT_FACTOR`` times the tokens of the lane's good requests; ``cache_miss`` when
     no prompt token came from the prefix cache while at least ``CACHED_SHARE`` of the lane's
     good requests hit it; then, by the pool's state at dispatch: when every slot was taken, or
     when the engine's span shows its own prefill explains less than half the phase's excess
     (its queue is in the queue phase: the request waited before the scheduler, in the engine's
     API server), as in the queue phase (``engine_queue`` by default); with a slot free,
     ``kv_pressure``, ``prefills_ahead`` when the requests in flight, or those sent while it
     was in flight, carried prompts longer than usual (as above: the engine's steps were busy
     prefilling them), or ``engine_queue`` when there were at least ``BUSY_FACTOR`` times as
     many requests in flight as they found, or more requests on the replica while it was in
     flight than it has slots (the pool was saturated); ``engine_slow`` when the engine's
     joined span shows its own prefill per token computed at least ``SLOW_FACTOR`` times the
     lane's good requests' and that pace explains half the excess (per token: a long prompt
     is not slow; ``engine_queue.engine_slow``); else ``other``;
   * phases ``first_token``, ``decode`` and ``stream``: ``slow_client`` when the relay was
     blocked writing to the client for at least half of the phase's excess (a stream always
     is: its phase is the client reading the rest); in ``decode``, ``kv_pressure`` when the
     engine was short of KV cache at dispatch (a preempted request stalls); with every slot
     taken at dispatch (each waiting request the engine admits is prefilled in the same
     steps as this one's decode), named as in the queue phase, ``engine_queue`` by default;
     with a slot free, as in prefill (``engine_slow`` by the engine's decode per output
     token); else ``other``.

Replicas, tenants and models are not causes of one request (one request cannot tell whether
its replica is unusual): ``vllm-obs query budget`` names the ones behind most misses.
The sidecar keeps a ``RunningBaseline`` per lane (bounded: a few numbers per lane, an
exponentially weighted mean); ``query budget`` computes the window's exact means instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from dataclasses import replace as _replace
from operator import attrgetter
from typing import Any, Final

from obs import engine_queue
from obs.config import Config, Lane
from obs.conventions import BAD_OUTCOMES, MISS_CAUSES, OK, PHASES, SLO_KINDS
from obs.record import Finished

LONG_PROMPT_FACTOR: Final = 2.0
CACHED_SHARE: Final = 0.5
TTFT_PHASES: Final[tuple[str, ...]] = PHASES[:3]
TPOT_PHASES: Final[tuple[str, ...]] = ("first_token", "decode")
# How many good requests the running baseline averages over (the weight of a new one).
BASELINE_REQUESTS: Final = 100
SLOW_CLIENT, UPSTREAM_ERROR, OTHER = "slow_client", "upstream_error", "other"
ENGINE_QUEUE, PREFILLS_AHEAD, KV_PRESSURE, ENGINE_SLOW = engine_queue.CAUSES
assert {SLOW_CLIENT, UPSTREAM_ERROR, OTHER, *engine_queue.CAUSES} <= set(MISS_CAUSES)
_PHASES_MS = attrgetter(*(f"{p}_ms" for p in PHASES))  # an event's phase times, in order


@dataclass(slots=True)  # not frozen: object.__setattr__ per field cost 1.8 against 0.24 µs
class Facts:
    """What the rule reads of one request (an event's fields); read, never written."""

    lane: str
    status: str
    stream: bool
    e2e_ms: float
    phases_ms: tuple[float, ...]  # in PHASES order
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    error_class: str | None = None
    error_phase: str | None = None
    rejection_reason: str | None = None
    prompt_tokens: int | None = None
    cache_hit: bool | None = None
    engine_queue_ms: float | None = None
    stream_blocked_ms: float = 0.0
    engine_view: str | None = None
    engine_prefill_ms: float | None = None
    # The pool's state at dispatch (the event's pool_* fields).
    pool_in_flight: int | None = None
    pool_max_running: int | None = None
    pool_waiting: int | None = None
    pool_kv_usage: float | None = None
    pool_preempting: bool | None = None
    pool_ahead_prompt_tokens: int | None = None
    pool_prompt_tokens_during: int | None = None
    pool_requests_during: int | None = None
    engine_decode_ms: float | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None

    @classmethod
    def of(cls, ev: Any) -> Facts:
        """From an ``obs.events.Event`` (or anything with its attributes)."""
        return cls(
            ev.lane,
            ev.status,
            bool(ev.stream),
            ev.e2e_ms,
            _PHASES_MS(ev),
            ev.ttft_ms,
            ev.tpot_ms,
            ev.error_class,
            ev.error_phase,
            ev.rejection_reason,
            ev.prompt_tokens,
            ev.cache_hit,
            ev.engine_queue_ms,
            ev.stream_blocked_ms or 0.0,
            ev.engine_view,
            ev.engine_prefill_ms,
            ev.pool_in_flight,
            ev.pool_max_running,
            ev.pool_waiting,
            ev.pool_kv_usage,
            ev.pool_preempting,
            ev.pool_ahead_prompt_tokens,
            ev.pool_prompt_tokens_during,
            ev.pool_requests_during,
            ev.engine_decode_ms,
            ev.completion_tokens,
            ev.cached_tokens,
        )

    @classmethod
    def of_row(cls, row: Mapping[str, Any]) -> Facts:
        """From an event as a mapping of its fields (a query's row; ClickHouse's 0/1 too)."""
        f = cls.of(_Row(row))
        hit, preempting = row.get("cache_hit"), row.get("pool_preempting")
        if hit is not None and not isinstance(hit, bool):
            f = _replace(f, cache_hit=bool(hit))
        if preempting is not None and not isinstance(preempting, bool):
            f = _replace(f, pool_preempting=bool(preempting))
        return f

    @property
    def ttft_value(self) -> float | None:
        """The value TTFT is judged on: ``ttft_ms``, or a successful non-stream's e2e."""
        if self.ttft_ms is not None:
            return self.ttft_ms
        return self.e2e_ms if not self.stream and self.status == OK else None


class _Row:
    __slots__ = ("_row",)

    def __init__(self, row: Mapping[str, Any]) -> None:
        self._row = row

    def __getattr__(self, name: str) -> Any:
        return self._row.get(name)


@dataclass(frozen=True, slots=True)
class Baseline:
    """What the lane's good requests take: mean phase times, prompt size, cache hits."""

    phases_ms: tuple[float, ...] = (0.0,) * len(PHASES)
    prompt_tokens: float | None = None
    cache_hit_ratio: float | None = None
    engine_queue_ms: float | None = None  # the engine's wait (none: 0), over every good one
    ahead_tokens: float | None = None  # prompt tokens in flight ahead, per request ahead
    in_flight: float | None = None  # requests in flight on the replica at dispatch
    prefill_per_token: float | None = None  # the engine's own (joined spans), ms per token
    decode_per_token: float | None = None


@dataclass(frozen=True, slots=True)
class Miss:
    """One missed gate of one request, with the phase and cause it is charged to."""

    slo: str  # one of SLO_KINDS
    phase: str  # one of PHASES
    cause: str  # one of MISS_CAUSES


def missed(f: Facts, lane: Lane | None) -> tuple[str, ...]:
    """The gates of ``lane`` that the request missed, in ``SLO_KINDS`` order."""
    if lane is None:
        return ()
    slo = lane.slo
    out = []
    for kind in SLO_KINDS:
        target = getattr(slo, kind)
        if target is None:
            continue
        if kind == "availability":
            bad = f.status in BAD_OUTCOMES
        else:
            value = f.ttft_value if kind == "ttft" else f.tpot_ms
            bad = value is not None and value > target.threshold_ms
        if bad:
            out.append(kind)
    return tuple(out)


def is_good(f: Facts, lane: Lane | None) -> bool:
    """Good (goodput): ``ok`` and within every latency gate of the lane that judges it."""
    return f.status == OK and not [k for k in missed(f, lane) if k != "availability"]


def attribute(f: Facts, lane: Lane | None, base: Baseline) -> tuple[Miss, ...]:
    """Each gate the request missed, with its phase and cause (empty for a good request)."""
    return tuple(_one(f, kind, base) for kind in missed(f, lane))


def _one(f: Facts, kind: str, base: Baseline) -> Miss:
    if kind == "availability":
        phase = f.error_phase if f.error_phase in PHASES else _worst(f, PHASES, base)
        return Miss(kind, phase, _failure_cause(f))
    candidates: tuple[str, ...] = TPOT_PHASES
    if kind == "ttft":
        candidates = TTFT_PHASES if f.ttft_ms is not None else PHASES
    phase = _worst(f, candidates, base)
    return Miss(kind, phase, _latency_cause(f, phase, base))


def excess(f: Facts, phase: str, base: Baseline) -> float:
    """How much longer than the lane's good requests the request took in ``phase``, in ms."""
    i = PHASES.index(phase)
    return f.phases_ms[i] - base.phases_ms[i]


def _worst(f: Facts, candidates: tuple[str, ...], base: Baseline) -> str:
    best = candidates[0]
    for p in candidates[1:]:
        if excess(f, p, base) > excess(f, best, base):
            best = p
    return best


def _failure_cause(f: Facts) -> str:
    if f.error_class == SLOW_CLIENT:
        return SLOW_CLIENT
    pool_side = (f.error_class or "").startswith("upstream_") or f.error_class == "oom"
    if pool_side or f.rejection_reason == "pool_unavailable":
        return UPSTREAM_ERROR
    return OTHER


def _latency_cause(f: Facts, phase: str, base: Baseline) -> str:
    over = excess(f, phase, base)
    if phase == "queue":
        if f.engine_queue_ms is not None:
            waited = f.engine_queue_ms - (base.engine_queue_ms or 0.0)
            if over > 0 and waited >= over / 2:
                return engine_queue.engine_cause(f, base) or ENGINE_QUEUE
        return "admission_queue"
    if phase == "prefill":
        if (
            f.prompt_tokens is not None
            and base.prompt_tokens
            and f.prompt_tokens >= LONG_PROMPT_FACTOR * base.prompt_tokens
        ):
            return "long_prefill"
        if f.cache_hit is False and (base.cache_hit_ratio or 0.0) >= CACHED_SHARE:
            return "cache_miss"
        if engine_queue.queued(f) or engine_queue.before_the_scheduler(f, over):
            return engine_queue.engine_cause(f, base) or ENGINE_QUEUE
        return engine_queue.busy_cause(f, base) or _slow_or_other(f, base, phase, over)
    if phase == "stream" or (over > 0 and f.stream_blocked_ms >= over / 2):
        return SLOW_CLIENT
    if phase == "decode":
        if engine_queue.queued(f):
            # A saturated pool admits each waiting request as a slot frees, and prefills it
            # in the same steps as the running requests' decode: long prompts ahead are
            # prefills_ahead, ordinary ones the pool's saturation.
            return engine_queue.engine_cause(f, base) or ENGINE_QUEUE
        return engine_queue.busy_cause(f, base) or _slow_or_other(f, base, phase, over)
    return OTHER


def _slow_or_other(f: Facts, base: Baseline, phase: str, over: float) -> str:
    return ENGINE_SLOW if engine_queue.engine_slow(f, base, phase, over) else OTHER


@dataclass(slots=True)
class RunningBaseline:
    """A lane's ``Baseline`` kept up to date from its good requests, in O(1) memory.

    Each mean is exponentially weighted: the first ``BASELINE_REQUESTS`` good requests are
    averaged plainly, later ones with weight ``1 / BASELINE_REQUESTS``.
    """

    n: int = 0
    phases_ms: list[float] = field(default_factory=lambda: [0.0] * len(PHASES))
    prompt: tuple[int, float] = (0, 0.0)  # (samples, mean)
    cached: tuple[int, float] = (0, 0.0)
    engine_queue: tuple[int, float] = (0, 0.0)
    ahead: tuple[int, float] = (0, 0.0)
    in_flight: tuple[int, float] = (0, 0.0)
    per_token: list[tuple[int, float]] = field(default_factory=lambda: [(0, 0.0)] * 2)

    def add(self, f: Facts) -> None:
        """Count one good request of the lane."""
        self.n += 1
        w = 1.0 / min(self.n, BASELINE_REQUESTS)
        for i, v in enumerate(f.phases_ms):
            self.phases_ms[i] += (v - self.phases_ms[i]) * w
        if f.prompt_tokens is not None:
            self.prompt = _mean(self.prompt, f.prompt_tokens)
        if f.cache_hit is not None:
            self.cached = _mean(self.cached, 1.0 if f.cache_hit else 0.0)
        # Every good request: one that waited for no slot waited 0 in the engine (the
        # queue phase's mean is over all of them too).
        self.engine_queue = _mean(self.engine_queue, f.engine_queue_ms or 0.0)
        per = engine_queue.ahead_per_request(f)
        if per is not None:
            self.ahead = _mean(self.ahead, per)
        if f.pool_in_flight is not None:
            self.in_flight = _mean(self.in_flight, f.pool_in_flight)
        paces = engine_queue.prefill_per_token(f), engine_queue.decode_per_token(f)
        for i, pace in enumerate(paces):
            if pace is not None:
                self.per_token[i] = _mean(self.per_token[i], pace)

    def snapshot(self) -> Baseline:
        """The baseline as the rule reads it."""
        return Baseline(
            tuple(self.phases_ms),
            self.prompt[1] if self.prompt[0] else None,
            self.cached[1] if self.cached[0] else None,
            self.engine_queue[1] if self.engine_queue[0] else None,
            self.ahead[1] if self.ahead[0] else None,
            self.in_flight[1] if self.in_flight[0] else None,
            *(mean if n else None for n, mean in self.per_token),
        )


def _mean(state: tuple[int, float], v: float) -> tuple[int, float]:
    n, mean = state
    n += 1
    return n, mean + (v - mean) / min(n, BASELINE_REQUESTS)


class Attributor:
    """The sidecar's side of the rule: one running baseline per lane, judged as requests end.

    ``judge(facts)`` updates the lane's baseline with a good request, or attributes the
    misses of a bad one against it (a bad request never moves the baseline).
    """

    def __init__(self, lanes: Mapping[str, Lane]) -> None:
        self._lanes = dict(lanes)
        self._baselines = {name: RunningBaseline() for name in self._lanes}

    def base_prefill_ms(self, lane: str) -> float:
        """The lane's good requests' mean prefill so far (0 before the first)."""
        base = self._baselines.get(lane)
        return base.phases_ms[PHASES.index("prefill")] if base is not None else 0.0

    def judge(self, f: Facts) -> tuple[Miss, ...]:
        lane = self._lanes.get(f.lane)
        base = self._baselines.get(f.lane)
        if lane is None or base is None:
            return ()
        if is_good(f, lane):
            base.add(f)
            return ()
        return attribute(f, lane, base.snapshot())


class MissStamp:
    """The record's attribution step: the sidecar's last processor, before every exporter
    (``obs.sidecar.record.recorder``).

    With no engine span joined, first splits a queued request's engine wait from its prefill
    (``obs.engine_queue``: ``engine_view: inferred``). Then sets the event's ``miss_slo``,
    ``miss_phase`` and ``miss_cause`` and the record's ``misses`` (every missed gate, for the
    ``slo_misses`` counter).
    """

    def __init__(self, config: Config) -> None:
        self._attributor = Attributor({lane.name: lane for lane in config.lanes})

    def on_start(self, start: object) -> None:
        return None

    def on_end(self, finished: Finished) -> Finished:
        ev = finished.event
        engine_queue.infer(finished, self._attributor.base_prefill_ms(ev.lane))
        misses = self._attributor.judge(Facts.of(ev))
        finished.misses = tuple((m.slo, m.phase, m.cause) for m in misses) if misses else ()
        if misses:
            ev.miss_slo = ",".join(m.slo for m in misses)
            ev.miss_phase, ev.miss_cause = misses[0].phase, misses[0].cause
        return finished
