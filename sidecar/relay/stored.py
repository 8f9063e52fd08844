"""The Responses API's stored responses through the relay: each request that names one goes
to the replica that holds it.

vLLM keeps a stored response on the replica that created it (``obs.sidecar.pools.homes``).
Three requests name one:

- ``POST /v1/responses`` with ``previous_response_id``: the next turn of a conversation
  whose state the replica holds. Sent to that replica (its pool, whatever the lane would
  choose: the state is nowhere else).
- ``GET /v1/responses/{id}`` (``?stream=true&starting_after=N`` replays a background
  response's events) and ``POST /v1/responses/{id}/cancel``: sent to its replica.

A response this sidecar did not see made (another sidecar's: behind a load balancer the next
turn often reaches another one; or from before a restart) is looked for: each replica of the
lane's pool in turn, until one answers other than 404 (vLLM answers a follow-up whose previous
response it does not hold 404 before generating anything; the last 404 is the client's), at
most ``homes.MAX_LOOKUPS`` a minute per client (then the sidecar's own 404).

Stored responses have owners (``homes.owner_of``): a request naming one that another key or
tenant made is answered 404 by the sidecar, as if it did not exist. Only the sidecar that saw
a response made knows its owner: one found by a lookup (another sidecar's, or from before a
restart) has none here, and anyone may name it. A client's ``request_id``
on ``POST /v1/responses`` (vLLM makes it the stored response's id) is dropped from the body
(``Stored.rewrite``): a client cannot choose an id, so cannot overwrite another's response.

A response's replica is learned from its answer: the id of a 2xx whole answer, or of a
stream's first event (``response.created``), unless the request said ``store: false``; and
from a lookup that found it (the replica that answered 2xx).
The event of a retrieval or a cancellation names its route with the id left out
(``STORED_ROUTE``, ``CANCEL_ROUTE``): one label for all of them, whatever the ids.
"""

from __future__ import annotations

import re
from typing import Any, Final
from urllib.parse import parse_qs

from obs.events import Event
from obs.sidecar.outcomes import Refusal, Refused
from obs.sidecar.pools.homes import ResponseHomes
from obs.sidecar.pools.pools import PoolSet, Replica
from obs.sidecar.types import Scope

RESPONSES: Final = "/v1/responses"
STORED_ROUTE: Final = "/v1/responses/{response_id}"
CANCEL_ROUTE: Final = "/v1/responses/{response_id}/cancel"
STORED_ROUTES: Final = {STORED_ROUTE: "retrieve_response", CANCEL_ROUTE: "cancel_response"}
PLANNED: Final = frozenset({RESPONSES, *STORED_ROUTES})  # the routes ``plan`` reads
# vLLM's ids are ``resp_`` and hex; OpenAI's ``resp_`` and base62. Any other path under
# /v1/responses/ is not relayed (the sidecar's own 404), so no path the pool would read
# otherwise (``..``, encoded slashes) reaches it.
_ID: Final = r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}"
_PREFIX: Final = "/v1/responses/"
_CANCEL: Final = "/cancel"
_PATH: Final = re.compile(rf"{_PREFIX}{_ID}({_CANCEL})?")


def is_stored(path: str) -> bool:
    """The path names a stored response (the app relays it)."""
    return path.startswith(_PREFIX) and route_of(path) is not None


def route_of(path: str) -> str | None:
    """The route template of a path that names a stored response, else None."""
    m = _PATH.fullmatch(path)
    if m is None:
        return None
    return CANCEL_ROUTE if m.group(1) else STORED_ROUTE


def method_of(route: str) -> str:
    """The method a relayed route is served for: GET for a retrieval, else POST."""
    return "GET" if route == STORED_ROUTE else "POST"


def streams(query: bytes) -> bool:
    """A retrieval asks for the response's events as a stream (``?stream=true``)."""
    if not query:
        return False
    values = parse_qs(query.decode("latin-1")).get("stream", ())
    return any(v.lower() == "true" for v in values)


class Stored:
    """What the relay knows of the stored response a request names, and learns of its own."""

    __slots__ = ("home", "lookup", "named", "owner", "rewrite", "store")

    def __init__(
        self,
        named: str | None,
        home: Replica | None,
        lookup: bool,
        store: bool,
        owner: str | None = None,
    ) -> None:
        self.named = named  # the id of the stored response it names
        self.home = home  # the replica holding the response it names (None: not known here)
        self.lookup = lookup  # not known here: look for it on each replica (404: the next)
        self.store = store  # its own answer may be stored: learn where (POST /v1/responses)
        self.owner = owner  # who makes the request (homes.owner_of): owns what it stores
        self.rewrite = False  # the body lost the client's request_id: send it re-encoded


def plan(
    ev: Event,
    scope: Scope,
    body: dict[str, Any] | None,
    homes: ResponseHomes,
    owner: str | None = None,
    client: str | None = None,
) -> Stored | None:
    """What a request of ``ev.route`` needs (None for any other route), once its lane placed
    it: the event's pool becomes the named response's replica's, and a retrieval's event says
    whether it asked for a stream. ``owner``: who makes the request (``homes.owner_of``);
    ``client``: whom its lookups are counted against. Refuses (404: ``Refused``) a response
    another owner made, or a lookup past the client's."""
    route = ev.route
    if route == RESPONSES:
        value = body.get("previous_response_id") if body is not None else None
        named = value if type(value) is str else None
        home = _home(homes, named, owner, client) if named is not None else None
        lookup = named is not None and home is None
        store = body is None or body.get("store") is not False
        found = Stored(named, home, lookup, store, owner)
        if body is not None and "request_id" in body:  # vLLM's stored id: never the client's
            del body["request_id"]
            found.rewrite = True
    elif route in STORED_ROUTES:
        # The path matched its route (route_of): the id lies after the prefix, before a
        # cancellation's suffix.
        path: str = scope["path"]
        end = len(path) - len(_CANCEL) if route == CANCEL_ROUTE else len(path)
        named = path[len(_PREFIX) : end]
        home = _home(homes, named, owner, client)
        if route == STORED_ROUTE:
            ev.stream = streams(scope.get("query_string", b""))
        found = Stored(named, home, home is None, False, owner)
    else:
        return None
    if home is not None:  # its state is there, nowhere else
        ev.pool = home.pool
    return found


def _home(
    homes: ResponseHomes, named: str, owner: str | None, client: str | None
) -> Replica | None:
    """The replica of ``named`` when ``owner`` may use it; None to look it up; a 404 ``Refused``
    when another owns it or the client has looked up too many unknown ids."""
    known, made_by = homes.owner(named)
    if known and made_by is not None and made_by != owner:
        raise Refused(Refusal(404, f"no stored response {named!r}"))
    home = homes.home(named)
    if home is None and not homes.may_look_up(client or owner or ""):
        why = "this client looked up too many unknown ids; retry in a minute"
        raise Refused(Refusal(404, f"no stored response {named!r} here ({why})"))
    return home


def candidates(
    stored: Stored | None, pools: PoolSet, pool: str, affinity: str | None
) -> list[Replica]:
    """The replicas to try, in order: up to two of ``pool`` (``PoolSet.candidates``), the
    response's replica first when it has one there; for a lookup, every replica of ``pool``
    once, the healthy ones first."""
    found = pools.candidates(pool, affinity)
    if stored is None:
        return found[:2]
    if stored.lookup:  # the lane's pool only: a client cannot make every pool look
        return [r for r in found if r.healthy] + [r for r in found if not r.healthy]
    home = stored.home
    if home is not None and home.pool == pool:
        found = [home, *(r for r in found if r is not home)]
    return found[:2]


def next_replica(stored: Stored | None, status: int) -> bool:
    """A pool answer on which the relay tries the next replica: vLLM's 503 (it sheds load with
    --max-num-queued-reqs), or a lookup's 404 (the response is not on that one)."""
    return status == 503 or (status == 404 and stored is not None and stored.lookup)


def learn(
    stored: Stored | None, status: int, answer_id: str | None, replica: Replica,
    homes: ResponseHomes,
) -> None:  # fmt: skip
    """A 2xx answer came from ``replica``: remember that it holds the response the request
    named (found by a lookup), and the answer's own (``answer_id``) unless it is not stored."""
    if stored is None or status >= 300:
        return
    if stored.lookup and stored.named is not None:  # found, not seen made: owner unknown
        homes.remember(stored.named, replica, None)
    if stored.store and answer_id is not None:
        homes.remember(answer_id, replica, stored.owner)
