"""Per-lane admission: concurrency, a bounded queue with timeout, a token budget, fair share.

A lane's gate admits a request at once when the lane has a free slot and
budget and nobody is queued ahead of it; otherwise the request waits in the
lane's queue, or is refused at once with a reason (a ``Refusal``, returned: the decision,
made the outcome by ``obs.sidecar.endings``):

| reason              | status | when                                                    |
|---------------------|--------|---------------------------------------------------------|
| ``prompt_too_long`` | 413    | estimated prompt tokens over ``max_prompt_tokens``      |
| ``over_token_budget``| 413   | prompt + max_tokens over the lane's whole ``token_budget``|
| ``tenant_share``    | 429    | the lane is full and the tenant holds its fair share    |
| ``queue_full``      | 429    | ``max_queue`` requests are waiting already              |
| ``queue_timeout``   | 429    | no slot within ``queue_timeout_s``                      |
| ``lower_priority``  | 429    | the queue was full and a higher priority took the place |

When a slot frees, the next request is the oldest one; with
``tenant_fair_share`` it is the oldest one of the tenant with the fewest
requests in flight, so one busy tenant cannot starve the others. A request
whose tokens do not fit the budget yet blocks those behind it (no overtaking),
so large requests are not starved by a stream of small ones. With a lane ``priority``
policy the next request is the one of highest priority after aging
(``obs.sidecar.policy.priority``), and a full queue gives up its lowest-ranked request to a
newcomer that ranks above it.

All of this is plain bookkeeping on the event loop: no locks, and for a lane
without limits only the in-flight counts (the gauges) are kept.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from dataclasses import dataclass, field

from obs import conventions as c
from obs.config import Admission, Lane
from obs.sidecar.outcomes import ADMISSION, Refusal
from obs.sidecar.policy import priority


@dataclass(slots=True, eq=False)
class Ticket:
    """One admitted (or waiting) request: what it holds of the lane."""

    tenant: str
    tokens: int
    waiter: asyncio.Future[bool] | None = field(default=None, repr=False)
    priority: int = (
        0  # 0-9, higher first (obs.sidecar.policy.priority), with a lane priority policy
    )
    queued_at: float = 0.0  # loop time it joined the queue (aging)
    displaced: bool = False  # a request of higher priority took its place in a full queue


class LaneGate:
    """The admission state of one lane."""

    def __init__(self, lane: Lane, workers: int = 1) -> None:
        self.lane = lane.name
        self.whole_budget = lane.admission.token_budget
        self.policy: Admission = lane.admission
        if workers > 1:  # this process's part of the lane's limits (obs.sidecar.server.workers)
            a = lane.admission
            self.policy = a.model_copy(
                update={
                    "max_concurrency": share(a.max_concurrency, workers),
                    "max_queue": share(a.max_queue, workers),
                    "token_budget": share(a.token_budget, workers),
                }
            )
        a = self.policy
        self.priority = lane.priority  # None: first come, first served
        self.limited = a.max_concurrency is not None or a.token_budget is not None
        self.in_flight = 0
        self.tokens = 0
        self.by_tenant: dict[str, int] = {}  # in flight + queued, per tenant
        self.running: dict[str, int] = {}  # in flight, per tenant
        self.queue: deque[Ticket] = deque()

    @property
    def queued(self) -> int:
        return len(self.queue)

    @property
    def needs_prompt_tokens(self) -> bool:
        """Whether this lane's limits, or its priority rules, read the prompt's size."""
        a, rules = self.policy, self.priority.rules if self.priority else []
        return (
            a.max_prompt_tokens is not None
            or a.token_budget is not None
            or any(r.match.min_prompt_tokens or r.match.max_prompt_tokens for r in rules)
        )

    def check(self, prompt_tokens: int | None, max_tokens: int | None) -> Refusal | None:
        """The refusal of what can never be admitted (413), else None."""
        a = self.policy
        pt = prompt_tokens or 0
        if a.max_prompt_tokens is not None and pt > a.max_prompt_tokens:
            why = f"the prompt is about {pt} tokens; lane {self.lane!r} accepts at most "
            return _refusal(c.PROMPT_TOO_LONG, f"{why}{a.max_prompt_tokens}", 413, None)
        cost = cost_of(prompt_tokens, max_tokens)
        if self.whole_budget is not None and cost > self.whole_budget:
            why = f"prompt plus max_tokens is about {cost} tokens, more than lane {self.lane!r}"
            budget = f"'s whole in-flight budget of {self.whole_budget}"
            return _refusal(c.OVER_TOKEN_BUDGET, why + budget, 413, None)
        return None

    async def admit(self, ticket: Ticket) -> bool | Refusal:
        """Wait for a slot: True once admitted (then :meth:`release` it), False when the
        ticket was withdrawn (its client left) while queued, or the ``Refusal``."""
        tenant = ticket.tenant
        if not self.limited or (not self.queue and self._fits(ticket.tokens)):
            self._take(ticket)
            return True
        a = self.policy
        if a.tenant_fair_share and self.by_tenant.get(tenant, 0) >= self._share(tenant):
            why = f"lane {self.lane!r} is full and tenant {tenant!r} holds its fair share "
            return _refusal(c.TENANT_SHARE, f"{why}({self._share(tenant)} requests)", 429, 1)
        if len(self.queue) >= a.max_queue and not self._displace(ticket):
            why = f"lane {self.lane!r} is at capacity and its queue is full "
            return _refusal(c.QUEUE_FULL, f"{why}({a.max_queue} waiting)", 429, 1)
        ticket.waiter = asyncio.get_running_loop().create_future()
        ticket.queued_at = asyncio.get_running_loop().time()
        self.queue.append(ticket)
        self.by_tenant[tenant] = self.by_tenant.get(tenant, 0) + 1
        try:
            admitted = await asyncio.wait_for(asyncio.shield(ticket.waiter), a.queue_timeout_s)
        except TimeoutError:
            admitted = ticket.waiter.done() and ticket.waiter.result()
            if not admitted:
                self._leave_queue(ticket)
                why = f"lane {self.lane!r} had no free slot within {a.queue_timeout_s:g} s"
                retry = max(1, math.ceil(a.queue_timeout_s / 2))
                return _refusal(c.QUEUE_TIMEOUT, why, 429, retry)
        except BaseException:
            if ticket.waiter.done() and ticket.waiter.result():
                self.release(ticket)
            else:
                self._leave_queue(ticket)
            raise
        if ticket.displaced:
            why = f"lane {self.lane!r} is at capacity and a request of higher priority took "
            place = f"this one's place in its full queue (priority {ticket.priority})"
            return _refusal(c.LOWER_PRIORITY, why + place, 429, 1)
        return admitted

    def withdraw(self, ticket: Ticket) -> None:
        """The client left while queued: stop waiting (``admit`` returns None)."""
        if ticket.waiter is not None and not ticket.waiter.done():
            self._leave_queue(ticket)
            ticket.waiter.set_result(False)

    def release(self, ticket: Ticket) -> None:
        self.in_flight -= 1
        self.tokens -= ticket.tokens
        self._drop_tenant(self.running, ticket.tenant)
        self._drop_tenant(self.by_tenant, ticket.tenant)
        if self.queue:
            self._wake()

    # ---- internals ----------------------------------------------------------------------

    def _fits(self, cost: int) -> bool:
        a = self.policy
        if a.max_concurrency is not None and self.in_flight >= a.max_concurrency:
            return False
        return a.token_budget is None or self.tokens + cost <= a.token_budget or not self.in_flight

    def _share(self, tenant: str) -> int:
        active = len(self.by_tenant) + (tenant not in self.by_tenant)
        slots = self.policy.max_concurrency or 1
        return max(1, math.ceil(slots / active))

    def _take(self, ticket: Ticket, *, queued: bool = False) -> None:
        self.in_flight += 1
        self.tokens += ticket.tokens
        self.running[ticket.tenant] = self.running.get(ticket.tenant, 0) + 1
        if not queued:
            self.by_tenant[ticket.tenant] = self.by_tenant.get(ticket.tenant, 0) + 1

    def _wake(self) -> None:
        while self.queue:
            nxt = self._next()
            if not self._fits(nxt.tokens):
                return
            self.queue.remove(nxt)
            assert nxt.waiter is not None
            self._take(nxt, queued=True)
            nxt.waiter.set_result(True)

    def _displace(self, ticket: Ticket) -> bool:
        """With a priority policy, make room in the full queue by giving up its lowest-ranked
        request if it ranks below ``ticket`` (that request is refused: lower_priority)."""
        if self.priority is None or not self.queue:
            return False
        now = asyncio.get_running_loop().time()
        victim = priority.displaced(self.queue, ticket.priority, now, self.priority.aging_s)
        if victim is None or victim.waiter is None:
            return False
        self.queue.remove(victim)
        self._drop_tenant(self.by_tenant, victim.tenant)
        victim.displaced = True
        victim.waiter.set_result(False)
        return True

    def _next(self) -> Ticket:
        if self.priority is not None:
            now = asyncio.get_running_loop().time()
            return priority.pick(self.queue, now, self.priority.aging_s)
        if not self.policy.tenant_fair_share:
            return self.queue[0]
        return min(self.queue, key=lambda t: self.running.get(t.tenant, 0))

    def _leave_queue(self, ticket: Ticket) -> None:
        if ticket in self.queue:
            self.queue.remove(ticket)
            self._drop_tenant(self.by_tenant, ticket.tenant)
            self._wake()

    @staticmethod
    def _drop_tenant(counts: dict[str, int], tenant: str) -> None:
        n = counts.get(tenant, 0) - 1
        if n > 0:
            counts[tenant] = n
        else:
            counts.pop(tenant, None)


def cost_of(prompt_tokens: int | None, max_tokens: int | None) -> int:
    """A request's token cost in its lane's budget: its prompt and its output cap."""
    return (prompt_tokens or 0) + (max_tokens or 0)


def _refusal(reason: str, detail: str, status: int, retry_after: int | None) -> Refusal:
    return Refusal(status, detail, reason, ADMISSION, retry_after)


def share(limit: int | None, workers: int) -> int | None:
    """One worker's part of a lane-wide limit (rounded up)."""
    return None if limit is None else math.ceil(limit / workers)
