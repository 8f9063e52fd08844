"""The engine's queue, inferred from the pool's state at dispatch when the engine sends no span.

Without the engine's request span, the sidecar sees only the outside: the time from dispatch
to the first token (the ``prefill`` phase) holds both the wait in the engine's own queue and
the prefill itself. Most deployments run vLLM without ``--otlp-traces-endpoint``, so this is
the common case, and charging the wait to prefill points the operator at the wrong lever.

The sidecar puts a snapshot of the serving replica's state on each event when it dispatches
the request (``pool_*`` fields): the requests it had in flight there (its own count, exact for
the traffic it relays), the replica's batch slots (the pool's declared ``max_num_seqs``, or
what the engine reports), and the engine's waiting requests, KV-cache usage and preemptions
at the sidecar's last poll. The rule here reads them:

* **queued**: the replica's slots were all taken at dispatch (in flight >= slots); with the
  slots unknown, the engine reported waiting requests at the last poll;
* **the wait**: a queued request's prefill beyond what the lane's good requests take in
  prefill (``Baseline``: their mean), never more than its prefill; moved from ``prefill``
  into ``queue`` as a joined span's ``time_in_queue`` is (``obs.engines.view``), and marked
  ``engine_view: inferred`` with the estimate in ``engine_queue_ms``.

An estimate: the lane's good requests set what a prefill takes, so a queued request whose
prefill is itself long (a long prompt, a batch of prefills) shows part of that as queue.
docs/query.md (Where the error budget went) gives its error against the engine's spans.
With the engine's span joined, the span wins: nothing here runs.

Then what the pool's state says kept the engine busy (the causes of ``obs.attribution``'s
rule that read it): ``engine_cause`` for a request that waited for a slot, ``busy_cause`` for
one that found a slot free, ``before_the_scheduler`` for a joined span's prefill that the
engine's own numbers do not explain. A request that waited behind requests of ordinary size
is the engine's queue; ``prefills_ahead`` needs prompts longer than usual, and the sidecar's
prompt estimate (request bytes / 4, the ``pool_*`` token fields) is compared only with the
same estimate of the lane's good requests, the engine's count (``prompt_tokens``) only with
its own (``longer_than_usual``). They read an ``obs.attribution`` ``Facts`` and
``Baseline`` (``f``, ``base``).
"""

from __future__ import annotations

from typing import Any, Final

from obs.phases import NS_PER_MS
from obs.record import Finished, fill_timings

INFERRED: Final = "inferred"
JOINED: Final = "joined"
# KV-cache usage at or above this share of the cache is pressure (vLLM preempts near full).
KV_PRESSURE_USAGE: Final = 0.9
ENGINE_QUEUE, PREFILLS_AHEAD, KV_PRESSURE = "engine_queue", "prefills_ahead", "kv_pressure"
# Prompts in flight ahead (per request, estimated: request bytes / 4) at least this many
# times what the lane's good requests found ahead of them (the same estimate), and further
# above that usual than the request's own prompt is above the lane's usual, are long prefills
# ahead: the engine was busy prefilling them.
AHEAD_FACTOR: Final = 2.0
# With no such baseline yet: this many times the request's own prompt (the engine's count;
# the estimate also counts the request's JSON, so it reads high, most for short prompts).
AHEAD_OWN_FACTOR: Final = 4.0
# A replica with at least this many times the requests in flight that the lane's good
# requests found there was saturated, slot free or not (each step serves a bigger batch).
BUSY_FACTOR: Final = 1.5


def queued(ev: Any) -> bool:
    """Whether the request waited for a batch slot in the engine, by the pool's state at
    dispatch (``ev`` an ``Event`` or anything with its ``pool_*`` attributes)."""
    in_flight, slots = ev.pool_in_flight, ev.pool_max_running
    if in_flight is not None and slots:
        return bool(in_flight >= slots)
    return bool(ev.pool_waiting)


def kv_pressure(ev: Any) -> bool:
    """Whether the engine was short of KV cache at dispatch: usage near full, or preempting."""
    return bool(ev.pool_preempting) or (ev.pool_kv_usage or 0.0) >= KV_PRESSURE_USAGE


def inferred_wait_ms(prefill_ms: float, base_prefill_ms: float) -> float:
    """The engine-queue estimate of a queued request: its prefill beyond the lane's usual."""
    return max(0.0, min(prefill_ms, prefill_ms - base_prefill_ms))


def infer(f: Finished, base_prefill_ms: float) -> bool:
    """Split a queued request's engine wait from its prefill (no engine span joined).

    Sets ``engine_view`` ``inferred`` and ``engine_queue_ms``, and moves the wait from the
    ``prefill`` phase into ``queue`` (the total never changes). Returns whether it did.
    """
    ev, clock = f.event, f.clock
    if ev.engine_view != "absent" or not clock.dispatched or not queued(ev):
        return False
    wait = inferred_wait_ms(ev.prefill_ms, base_prefill_ms)
    ev.engine_view, ev.engine_queue_ms = INFERRED, round(wait, 3)
    prefill_end = clock.first_up or clock.end
    clock.dispatched += min(int(wait * NS_PER_MS), max(0, prefill_end - clock.dispatched))
    fill_timings(f)
    return True


def before_the_scheduler(f: Any, over: float) -> bool:
    """With the engine's span joined: the engine's own queue and prefill explain less than
    half of the prefill phase's excess, so the request waited before its scheduler saw it
    (vLLM's API server, busy with the requests it already serves): the pool was saturated."""
    if f.engine_view != JOINED or f.engine_prefill_ms is None or over <= 0:
        return False
    return f.engine_prefill_ms + (f.engine_queue_ms or 0.0) < over / 2


def busy_cause(f: Any, base: Any) -> str | None:
    """With a slot free at dispatch: KV pressure; prompts longer than usual in flight at
    dispatch or sent while it was in flight (``longer_than_usual``, per request); else the
    pool saturated (``engine_queue``): at least ``BUSY_FACTOR`` times the requests in flight
    that the lane's good requests found, or more requests on the replica while it was in
    flight than it has slots (those in flight, this one and those sent meanwhile; the engine
    admits and prefills them, and its API server takes them in, in the same steps). None
    when it names none of these."""
    if kv_pressure(f):
        return KV_PRESSURE
    if longer_than_usual(ahead_per_request(f), f, base) or longer_than_usual(
        during_per_request(f), f, base
    ):
        return PREFILLS_AHEAD
    n, slots = f.pool_in_flight, f.pool_max_running
    if n and base.in_flight is not None and n >= BUSY_FACTOR * max(base.in_flight, 1.0):
        return ENGINE_QUEUE
    if n is not None and slots and n + 1 + (f.pool_requests_during or 0) > slots:
        return ENGINE_QUEUE
    return None


def engine_cause(f: Any, base: Any) -> str | None:
    """What the pool's state at dispatch says kept a request that waited for a slot: KV
    pressure, or long prompts in flight ahead (``longer_than_usual``); None when it names
    neither (requests of ordinary size filled the slots: the engine's queue)."""
    if kv_pressure(f):
        return KV_PRESSURE
    if longer_than_usual(ahead_per_request(f), f, base):
        return PREFILLS_AHEAD
    return None


def longer_than_usual(per: float | None, f: Any, base: Any) -> bool:
    """Whether prompts of ``per`` estimated tokens each (in flight ahead, or sent meanwhile)
    are long prefills for the request ``f``: at least ``AHEAD_FACTOR`` times the prompts the
    lane's good requests found ahead of them (the same estimate), and further above them
    than ``f``'s own prompt is above the lane's (else its own prefill is the longer one).
    With no such baseline: at least ``AHEAD_OWN_FACTOR`` times its own prompt (or the
    lane's usual prompt, if longer); with neither, no claim."""
    if per is None:
        return False
    own = f.prompt_tokens or 0
    if base.ahead_tokens:
        ratio = per / base.ahead_tokens
        return ratio >= AHEAD_FACTOR and (
            not base.prompt_tokens or ratio > own / base.prompt_tokens
        )
    ref = max(own, base.prompt_tokens or 0)
    return bool(ref) and per >= AHEAD_OWN_FACTOR * ref


def ahead_per_request(f: Any) -> float | None:
    """The prompt tokens in flight on the replica at dispatch, per request in flight."""
    ahead, n = f.pool_ahead_prompt_tokens, f.pool_in_flight
    return ahead / n if ahead is not None and n else None


def during_per_request(f: Any) -> float | None:
    """The prompt tokens sent to the replica while the request was in flight, per request."""
    tokens, n = f.pool_prompt_tokens_during, f.pool_requests_during
    return tokens / n if tokens is not None and n else None
