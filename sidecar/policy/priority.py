"""Priority within a lane: which request a lane's queue admits next, and which it gives up.

Pure policy over queued tickets (``obs.sidecar.policy.admission.Ticket``). A request's priority
(0-9, higher first) comes from the lane's ``priority`` block (``resolve``). While it
waits, a ticket gains one level per ``aging_s`` seconds (``effective``), so a request
waiting ``(9 - p) * aging_s`` seconds ranks with any request arriving at the top level:
no request starves while the lane keeps admitting. On a full queue a newcomer of higher
priority takes the place of the lowest-ranked waiting request (``displaced``), which is
refused with ``lower_priority``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

from obs.config import Priority
from obs.lanes import RequestAttrs, matches

MAX_PRIORITY = 9


class Queued(Protocol):
    @property
    def priority(self) -> int: ...
    @property
    def queued_at(self) -> float: ...


T = TypeVar("T", bound=Queued)


def resolve(policy: Priority, headers: Mapping[str, str], attrs: RequestAttrs) -> int:
    """The request's priority: the header's digit (when the policy names a header; capped at
    the tenant's level), else the tenant's, else the first rule's, else the default."""
    tenant = policy.tenants.get(attrs.tenant) if attrs.tenant is not None else None
    if policy.header is not None:
        asked = digit(headers.get(policy.header.lower(), ""))
        if asked is not None:
            return asked if tenant is None else min(asked, tenant)
    if tenant is not None:
        return tenant
    for rule in policy.rules:
        if matches(rule.match, attrs):
            return rule.priority
    return policy.default


def digit(raw: str) -> int | None:
    """One ASCII digit 0-9 (spaces around allowed), else None: ``'¹'``, ``'٣'``, ``'12'``."""
    raw = raw.strip()
    return ord(raw) - 48 if len(raw) == 1 and "0" <= raw <= "9" else None


def effective(t: Queued, now: float, aging_s: float) -> float:
    """The ticket's priority after aging: one level per ``aging_s`` seconds waited."""
    return t.priority + max(0.0, now - t.queued_at) / aging_s


def pick(queue: Sequence[T], now: float, aging_s: float) -> T:
    """The ticket to admit next: highest effective priority, the oldest on a tie."""
    best, best_rank = queue[0], float("-inf")
    for t in queue:  # a deque: no slicing
        rank = effective(t, now, aging_s)
        if rank > best_rank:
            best, best_rank = t, rank
    return best


def displaced(queue: Sequence[T], priority: int, now: float, aging_s: float) -> T | None:
    """On a full queue, the ticket a newcomer of ``priority`` replaces: the lowest-ranked
    one (the youngest on a tie) if it ranks below the newcomer, else None."""
    worst: T | None = None
    worst_rank = float(priority)
    for t in queue:
        rank = effective(t, now, aging_s)
        if rank < worst_rank or (worst is not None and rank == worst_rank):
            worst, worst_rank = t, rank
    return worst
