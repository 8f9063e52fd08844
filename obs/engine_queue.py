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
"""

from __future__ import annotations

from typing import Any, Final

from obs.phases import NS_PER_MS
from obs.record import Finished, fill_timings

INFERRED: Final = "inferred"
JOINED: Final = "joined"
# KV-cache usage at or above this share of the cache is pressure (vLLM preempts near full).
KV_PRESSURE_USAGE: Final = 0.9


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
