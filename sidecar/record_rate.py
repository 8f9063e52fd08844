"""How many events of refused requests are written: a token bucket, counters exact.

A request the sidecar refuses before any pool sees it (a missing key: 401, bad
JSON: 400, too large: 413, an admission rejection: 429) costs a client almost
nothing to send, and its event about a kilobyte: unlimited, a flood of them
would rotate the record of real requests away. Up to ``per_s`` such events a
second (bursts of as many) are written; the others still reach the metrics
(``vllm_obs_requests_total``, ``vllm_obs_admission_rejections_total``) and are
counted in ``vllm_obs_rejected_events_skipped_total``.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter

from obs import conventions as c
from obs.events import Event

_REFUSED = (c.REJECTED, c.CLIENT_ERROR)


class RefusedRecord:
    """``keep(event)``: whether the event goes to the record (JSONL, spans) or metrics only."""

    def __init__(self, per_s: float, registry: CollectorRegistry) -> None:
        self.per_s = per_s
        self._tokens = per_s
        self._at = time.monotonic()
        m = c.REJECTED_EVENTS_SKIPPED
        self.skipped = Counter(m.name, m.help, m.labels, registry=registry)

    def keep(self, ev: Event) -> bool:
        if ev.replica is not None or ev.status not in _REFUSED:
            return True  # reached a pool (or failed there): always recorded
        now = time.monotonic()
        self._tokens = min(self.per_s, self._tokens + (now - self._at) * self.per_s)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        self.skipped.inc()
        return False
