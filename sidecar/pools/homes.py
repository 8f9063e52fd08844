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
is looked for on each replica in turn.
"""

from __future__ import annotations

from collections import OrderedDict

from obs.sidecar.pools.pools import Replica

MAX_HOMES = 65_536  # ~10 MB at most: an id and a reference each


class ResponseHomes:
    """Response id -> the replica that holds it; the ``limit`` most recent are kept."""

    __slots__ = ("_homes", "limit")

    def __init__(self, limit: int = MAX_HOMES) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        self.limit = limit
        self._homes: OrderedDict[str, Replica] = OrderedDict()

    def remember(self, response_id: str, replica: Replica) -> None:
        """``response_id`` lives on ``replica`` (most recent first out of the oldest)."""
        homes = self._homes
        homes[response_id] = replica
        homes.move_to_end(response_id)
        if len(homes) > self.limit:
            homes.popitem(last=False)

    def home(self, response_id: str) -> Replica | None:
        """The replica holding ``response_id``, if this sidecar saw it created."""
        return self._homes.get(response_id)

    def __len__(self) -> int:
        return len(self._homes)
