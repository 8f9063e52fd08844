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
engine's own numbers do not explain. They read an ``obs.attribution`` ``Facts`` and
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
# Prompts in flight ahead (per request) at least this many times what the lane's good
# requests found ahead of them, and longer than the request's own, are long prefills ahead:
# the engine was busy prefilling them. With no such baseline yet: this many times its own.
AHEAD_FACTOR: Final = 2.0
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
    """With a slot free at dispatch: KV pressure, or a batch carrying far more prompt tokens
    than the lane's good requests found in it (``AHEAD_FACTOR`` times their mean; with no
    such baseline, ``AHEAD_OWN_FACTOR`` times its own prompt per request): the engine's steps
    were busy prefilling them."""
    if kv_pressure(f):
        return KV_PRESSURE
    ahead, n = f.pool_ahead_prompt_tokens, f.pool_in_flight
    if n and base.in_flight is not None and n >= BUSY_FACTOR * max(base.in_flight, 1.0):
        busy = ENGINE_QUEUE  # a batch far bigger than usual: the pool was saturated
    else:
        busy = None
    rate = during_rate(f)
    if rate and base.during_rate is not None and rate >= AHEAD_FACTOR * max(base.during_rate, 1e-3):
        return PREFILLS_AHEAD  # far more prompt tokens than usual arrived while it ran
    if not ahead:
        return busy
    if base.ahead_total is not None:
        return PREFILLS_AHEAD if ahead >= AHEAD_FACTOR * max(base.ahead_total, 1) else busy
    per = ahead_per_request(f) or 0.0  # no baseline yet: against the request's own prompt
    own = max(f.prompt_tokens or 0, base.prompt_tokens or 0, 1)
    return PREFILLS_AHEAD if per >= AHEAD_OWN_FACTOR * own else busy


def engine_cause(f: Any, base: Any) -> str | None:
    """What the pool's state at dispatch says kept the engine busy: KV pressure, or long
    prompts in flight ahead (per request at least ``AHEAD_FACTOR`` times what the lane's good
    requests found ahead, and longer than its own; with no such baseline, ``AHEAD_OWN_FACTOR``
    times its own); None when it names neither."""
    if kv_pressure(f):
        return KV_PRESSURE
    per = ahead_per_request(f)
    if per is not None:
        own = f.prompt_tokens or 0
        if base.ahead_tokens:
            if per >= AHEAD_FACTOR * base.ahead_tokens and per > own:
                return PREFILLS_AHEAD
        elif per >= AHEAD_OWN_FACTOR * max(own, base.prompt_tokens or 0, 1):
            return PREFILLS_AHEAD
    return None


def during_rate(f: Any) -> float | None:
    """Others' prompt tokens sent to the replica per ms while the request was in flight."""
    n = f.pool_prompt_tokens_during
    return None if n is None else n / (f.e2e_ms + 1.0)


def ahead_per_request(f: Any) -> float | None:
    """The prompt tokens in flight on the replica at dispatch, per request in flight."""
    ahead, n = f.pool_ahead_prompt_tokens, f.pool_in_flight
    return ahead / n if ahead is not None and n else None
