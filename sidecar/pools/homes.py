"""Where each stored response lives: the replica that created it.

vLLM keeps the Responses API's stored responses in the memory of the replica that answered
(``VLLM_ENABLE_RESPONSES_API_STORE=1``; ``vllm/entrypoints/openai/responses/serving.py``):
a follow-up that names one (``previous_response_id``), a retrieval
(``GET /v1/responses/{id}``) or a cancellation (``POST /v1/responses/{id}/cancel``) sent to
another replica of the pool is answered 404. So the relay learns each response's replica from
its answer and sends what names it there (``obs.sidecar.relay.stored``).

The map is this sidecar's and bounded: the oldest entries go first (a replica keeps its stored
responses until it restarts, so an entry may outlive them; then the replica's own 404 is the
answer). A response this sidecar did not see (another sidecar's, or one from before a restart)
is looked for on each replica of the request's pool in turn, at most ``MAX_LOOKUPS`` times per
client in ``LOOKUP_WINDOW_S`` (``may_look_up``): an unknown id costs each replica a 404.

Each entry names its owner (``owner_of``: the client's API key hash, else its tenant; None
when the sidecar knows neither): a request from anyone else finds nothing (404), as if the
response did not exist.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from obs.sidecar.pools.pools import Replica

MAX_HOMES = 65_536  # ~10 MB at most: an id and a reference each
MAX_LOOKUPS = 120  # lookups of ids this sidecar does not know, per client per window
LOOKUP_WINDOW_S = 60.0
MAX_LOOKERS = 10_000  # clients whose lookups are counted (the oldest forgotten first)


def owner_of(key_hash: str | None, tenant: str | None) -> str | None:
    """Who owns what a request stores: its checked API key, else its tenant, else nobody."""
    if key_hash is not None:
        return f"key:{key_hash}"
    return f"tenant:{tenant}" if tenant is not None else None


class ResponseHomes:
    """Response id -> the replica that holds it; the ``limit`` most recent are kept."""

    __slots__ = ("_homes", "_lookups", "clock", "limit", "max_lookups")

    def __init__(
        self,
        limit: int = MAX_HOMES,
        clock: Callable[[], float] = time.monotonic,
        max_lookups: int = MAX_LOOKUPS,
    ) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        self.limit = limit
        self.clock = clock
        self.max_lookups = max_lookups
        self._homes: OrderedDict[str, tuple[Replica, str | None]] = OrderedDict()
        self._lookups: OrderedDict[str, tuple[float, int]] = OrderedDict()  # client: window

    def remember(self, response_id: str, replica: Replica, owner: str | None = None) -> None:
        """``response_id``, made by ``owner``, lives on ``replica`` (most recent first out of
        the oldest). An id already owned by another is not taken over."""
        homes = self._homes
        had = homes.get(response_id)
        if had is not None and had[1] != owner:
            return
        homes[response_id] = (replica, owner)
        homes.move_to_end(response_id)
        if len(homes) > self.limit:
            homes.popitem(last=False)

    def home(self, response_id: str) -> Replica | None:
        """The replica holding ``response_id``, if this sidecar saw it created."""
        entry = self._homes.get(response_id)
        return entry[0] if entry is not None else None

    def owner(self, response_id: str) -> tuple[bool, str | None]:
        """(known, its owner): whether this sidecar saw ``response_id`` made, and by whom."""
        entry = self._homes.get(response_id)
        return (False, None) if entry is None else (True, entry[1])

    def may_look_up(self, client: str) -> bool:
        """Count one lookup of an unknown id by ``client``: False past ``max_lookups`` in its
        window of ``LOOKUP_WINDOW_S``."""
        now = self.clock()
        began, n = self._lookups.get(client, (now, 0))
        if now - began >= LOOKUP_WINDOW_S:
            began, n = now, 0
        if n >= self.max_lookups:
            return False
        self._lookups[client] = (began, n + 1)
        self._lookups.move_to_end(client)
        if len(self._lookups) > MAX_LOOKERS:
            self._lookups.popitem(last=False)
        return True

    def __len__(self) -> int:
        return len(self._homes)
