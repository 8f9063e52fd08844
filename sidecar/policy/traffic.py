"""Traffic control per request: which arm of a split lane it takes, and falling back.

The arm is chosen by ``obs.splits`` from the client's identity, as the lane's
``canary.sticky`` names it: the API key (hashed here, never kept), the tenant, or the
client's address; a request without that identity uses its address, and one without an
address its request id. The hash is keyed with the sidecar's split salt (a secret), and
the event keeps a keyed hash of the identity (``identity``), so that ``query canary`` can
cap one client's weight in its verdict. A fallback (:class:`FallBack`) is raised by the relay only
before anything was sent to the client. Policy decides and returns: a fallback's reason, or
how the request ended instead (an ``Ending``, made the outcome by ``obs.sidecar.endings``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from obs import conventions as c
from obs import splits
from obs.config import Lane
from obs.events import Event
from obs.lanes import RequestAttrs
from obs.sidecar import endings as end
from obs.sidecar.endings import Ending
from obs.sidecar.outcomes import FallBack, UpstreamTimeout
from obs.sidecar.policy import priority
from obs.sidecar.types import Scope


def identity(
    sticky: str, headers: Mapping[str, str], tenant: str | None, scope: Scope, request_id: str
) -> str:
    """The client identity that keeps a split lane's requests on one arm."""
    if sticky == "api_key":
        scheme, _, key = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and key.strip():
            return "key:" + hashlib.sha256(key.strip().encode()).hexdigest()
    elif sticky == "tenant" and tenant:
        return "tenant:" + tenant
    client = scope.get("client")
    if client:
        return f"address:{client[0]}"
    return "request:" + request_id


def place(
    ev: Event,
    lane: Lane,
    headers: Mapping[str, str],
    scope: Scope,
    attrs: RequestAttrs,
    salt: bytes = b"",
) -> None:
    """Set the event's pool (its arm, for a split lane, with the identity's keyed hash) and its
    priority in the lane."""
    if lane.split is None:
        ev.pool, ev.arm = lane.pool, None
    else:
        who = identity(lane.canary_policy.sticky, headers, ev.tenant, scope, ev.request_id)
        ev.pool = ev.arm = splits.choose(lane.arms, f"{lane.name}|{who}", salt)
        ev.identity = splits.identity_hash(who, salt)
    if lane.priority is not None:
        ev.priority = priority.resolve(lane.priority, headers, attrs)


def fallback_pool(lane: Lane, pool: str) -> str | None:
    """Where a request the pool ``pool`` failed goes next: the lane's fallback, never itself."""
    return None if lane.fallback in (None, pool) else lane.fallback


def refused(status: int) -> bool:
    """A pool's answer that sends the request to the fallback: 5xx, or 429 (too busy)."""
    return status >= 500 or status == 429


def unavailable(pool: str, last: Exception | None, may_fall_back: bool) -> str | Ending:
    """No replica of ``pool`` accepted a connection: the fallback's reason, or the ending."""
    if may_fall_back:
        return c.FALLBACK_UNAVAILABLE
    why = f"({last if last else 'no replicas'})"
    detail = f"pool {pool!r} is unavailable: no replica accepted a connection {why}"
    return Ending(end.UNAVAILABLE, detail)


def fallback_reason(
    err: Exception, lane: Lane, fallback: str | None, *, stream: bool, started: bool, gone: bool
) -> str | Ending | None:
    """Whether a request that failed with ``err`` on its pool goes once to ``fallback``: the
    reason it does (the event's ``fallback_reason``), or how it ends instead: an ``Ending``,
    or None when ``err`` stands.

    A decision only: the relay owns the loop that routes the request again (policy never
    calls the relay). ``started``: the client has the response head; ``gone``: it left."""
    if isinstance(err, FallBack):
        return err.reason
    if not isinstance(err, UpstreamTimeout):
        return None
    if not (stream or started):
        # A non-streamed answer's first byte comes with its last token, so its timeout
        # says the pool was still generating, not that it never started: the lane's
        # deadline, never sent to a second pool to do the work twice.
        return Ending(end.ANSWER_DEADLINE, seconds=lane.timeouts.first_token_s)
    if fallback is None or started or gone:
        return None  # streaming began (or nobody waits): never a second answer
    return c.FALLBACK_TIMEOUT
