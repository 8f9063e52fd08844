"""Stored responses have owners (issue 63): another key's retrieval or cancellation finds
nothing, a client cannot choose a stored id, and a lookup of an unknown id stays in the
lane's pool and is capped per client.

The in-process sidecar with two API keys of two tenants; the pool is ``ScriptedUpstream``
(two replicas of the lane's pool and one of another pool, all the same server): it answers
the scripted statuses and records what each replica was sent, which a real engine does not
report.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from obs.config import parse_config
from obs.events import Event
from obs.sidecar.outcomes import Refused
from obs.sidecar.pools.homes import MAX_LOOKUPS, ResponseHomes
from obs.sidecar.pools.pools import PoolSet
from obs.sidecar.relay import stored
from tests.sidecar.conftest import InprocFactory
from tests.support.inproc import InProcessSidecar, request_id
from tests.support.scripted_upstream import Script, ScriptedUpstream

pytestmark = pytest.mark.inproc

KEYS = {"sk-alice": "alice", "sk-bob": "bob"}
RESPONSE_ID = "resp_0123456789abcdef"


@pytest.fixture
def owned(scripted: ScriptedUpstream, inproc: InprocFactory) -> InProcessSidecar:
    """Keys of two tenants; the lane's pool has two replicas, another pool one."""
    local = scripted.url.replace("127.0.0.1", "localhost")
    config = parse_config(
        {
            "pools": [
                {"name": "chat", "replicas": [scripted.url, local]},
                {"name": "other", "replicas": [f"http://0.0.0.0:{scripted.port}"]},
            ],
            "lanes": [{"name": "main", "pool": "chat"}],
            "default_lane": "main",
            "auth": {
                "api_keys": [
                    {"sha256": hashlib.sha256(k.encode()).hexdigest(), "tenant": t}
                    for k, t in KEYS.items()
                ]
            },
        }
    )
    return inproc(config)


def _post(sc: InProcessSidecar, key: str, path: str, body: dict[str, object], rid: str) -> int:
    r = sc.client.post(
        path, json=body, headers={"authorization": f"Bearer {key}", "x-request-id": rid}
    )
    return r.status_code


def _made(sc: InProcessSidecar, scripted: ScriptedUpstream, body: dict[str, object]) -> None:
    """Alice makes a stored response (the pool answers with ``RESPONSE_ID``)."""
    rid = request_id()
    answer = {"object": "response", "id": RESPONSE_ID, "status": "completed", "output": []}
    scripted.scripts[rid] = Script(content_type="application/json",
                                   pieces=[json.dumps(answer).encode()])  # fmt: skip
    assert _post(sc, "sk-alice", "/v1/responses", body, rid) == 200


def _sent(scripted: ScriptedUpstream, path: str) -> int:
    return sum(1 for p, _ in scripted.received if p == path)


def test_another_keys_cancellation_finds_nothing(
    owned: InProcessSidecar, scripted: ScriptedUpstream
) -> None:
    """Bob cancelling Alice's stored response gets 404 from the sidecar (no pool asked);
    Alice's own cancellation reaches its replica (before: Bob's did too)."""
    _made(owned, scripted, {"model": "m", "input": "hi"})
    cancel = f"/v1/responses/{RESPONSE_ID}/cancel"
    before = _sent(scripted, cancel)
    bob = _post(owned, "sk-bob", cancel, {}, request_id())
    after_bob = _sent(scripted, cancel)
    alice = _post(owned, "sk-alice", cancel, {}, request_id())
    assert (bob, after_bob - before) == (404, 0)
    assert alice == 200 and _sent(scripted, cancel) == after_bob + 1


def test_a_client_request_id_is_not_the_stored_id(
    owned: InProcessSidecar, scripted: ScriptedUpstream
) -> None:
    """A ``request_id`` in a /v1/responses body (vLLM's stored id) never reaches the pool:
    a client cannot name, and so overwrite, another's stored response."""
    _made(owned, scripted, {"model": "m", "input": "hi", "request_id": "resp_victim"})
    sent = [json.loads(b) for p, b in scripted.received if p == "/v1/responses"]
    assert sent and "request_id" not in sent[-1] and sent[-1]["input"] == "hi"


def test_an_unknown_id_is_looked_up_in_the_lanes_pool_only_and_capped(
    owned: InProcessSidecar, scripted: ScriptedUpstream
) -> None:
    """A cancellation of an id this sidecar never saw asks each replica of the lane's pool
    once (2), never the other pool's (before: every replica of every pool); past
    ``MAX_LOOKUPS`` a minute the client's lookups are the sidecar's own 404."""
    path = "/v1/responses/resp_unknown/cancel"
    codes = []
    for _ in range(MAX_LOOKUPS + 1):
        rid = request_id()
        scripted.scripts[rid] = Script(status=404, content_type="application/json",
                                       pieces=[b'{"error": {"message": "not found"}}'])  # fmt: skip
        codes.append(_post(owned, "sk-bob", path, {}, rid))
    assert codes == [404] * (MAX_LOOKUPS + 1)
    assert _sent(scripted, path) == 2 * MAX_LOOKUPS


def test_a_response_found_by_lookup_has_no_owner_here() -> None:
    """A response this sidecar saw made is its maker's (another key: a 404 refusal); one it
    found by a lookup (another sidecar made it) has no owner here, so whoever looked it up
    does not claim it from its maker."""
    config = parse_config(
        {
            "pools": [{"name": "p", "replicas": ["http://a:1"]}],
            "lanes": [{"name": "main", "pool": "p"}],
            "default_lane": "main",
        }
    )
    (replica,) = PoolSet(config, 60.0).replicas["p"]
    homes = ResponseHomes()

    def plan(owner: str, named: str) -> stored.Stored | None:
        ev = Event(route="/v1/responses", pool="p")
        return stored.plan(ev, {"path": "/v1/responses"}, {"previous_response_id": named},
                           homes, owner, owner)  # fmt: skip

    made = stored.plan(Event(route="/v1/responses", pool="p"), {"path": "/v1/responses"}, {},
                       homes, "key:alice", "alice")  # fmt: skip
    stored.learn(made, 200, "resp_made", replica, homes)
    with pytest.raises(Refused) as other:
        plan("key:bob", "resp_made")
    assert other.value.refusal.status == 404
    found = plan("key:bob", "resp_elsewhere")
    assert found is not None and found.lookup
    stored.learn(found, 200, None, replica, homes)
    alice = plan("key:alice", "resp_elsewhere")
    assert alice is not None and alice.home is replica
