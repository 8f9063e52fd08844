"""A full pool queue honours priority (issue 63): a higher band displaces a lower one, and no
flow keeps a full queue to itself.

The pool gate on its own, its engine played by the test (no real engine can hold its running
count still while the gate's bookkeeping is checked). The flood is the review's: one tenant's
300 band-0 batch requests, then another tenant's 15 band-7 chats (before: 15 of 15 refused
``pool_queue_full``).
"""

from __future__ import annotations

import asyncio

from obs import conventions as c
from obs.config import Config, parse_config
from obs.sidecar.outcomes import Refusal
from obs.sidecar.policy import saturation as sat
from obs.sidecar.policy.pool_gate import Hold, PoolGate
from obs.sidecar.policy.pool_queue import PoolQueue, Waiting

MAX_QUEUE = 256


def _config() -> Config:
    return parse_config(
        {
            "pools": [
                {
                    "name": "p",
                    "replicas": ["http://127.0.0.1:9"],
                    "engine": {"kind": "sim", "max_num_seqs": 4},
                    "saturation": {"max_waiting": 0, "hysteresis": 0, "max_queue": MAX_QUEUE},
                }
            ],
            "lanes": [{"name": "chat", "pool": "p"}, {"name": "batch", "pool": "p"}],
            "default_lane": "chat",
        }
    )


def _full_gate() -> PoolGate:
    """A gate whose pool is full (four of ours running on four slots)."""
    config = _config()

    def view() -> tuple[list[sat.ReplicaView], float | None]:
        return [sat.ReplicaView(True, 0.0, 4.0, None)], 0.0

    gate = PoolGate(config, config.pools[0], view, 1.0)
    gate.in_flight = 4
    gate.polled()
    return gate


async def _outcome(gate: PoolGate, lane: str, tenant: str, band: int) -> str:
    got = await gate.admit(lane, tenant, band, 600, Hold())
    if isinstance(got, Refusal):
        return str(got.reason)
    return "admitted" if got else "withdrawn"


def test_a_band_0_flood_filling_the_queue_refuses_no_band_7_chat() -> None:
    """300 band-0 requests fill the 256-place queue (44 refused); 15 band-7 chats of another
    tenant each take a batch request's place (15 batch displaced, no chat refused), and are
    the first admitted as slots free."""
    gate = _full_gate()

    async def go() -> None:
        batch = [asyncio.create_task(_outcome(gate, "batch", "a", 0)) for _ in range(300)]
        await asyncio.sleep(0)
        chats = [asyncio.create_task(_outcome(gate, "chat", "b", 7)) for _ in range(15)]
        await asyncio.sleep(0)
        assert gate.queued == MAX_QUEUE
        for _ in range(15):
            gate.release()
        assert await asyncio.gather(*chats) == ["admitted"] * 15
        done = [t.result() for t in batch if t.done()]
        assert sorted(done) == [c.POOL_QUEUE_FULL] * (44 + 15)
        for t in batch:
            t.cancel()
        await asyncio.gather(*batch, return_exceptions=True)

    asyncio.run(go())


def test_one_flow_cannot_keep_a_full_queue_from_another_of_its_band() -> None:
    """One tenant fills the queue in band 0; another tenant's band-0 request takes the place
    of the first tenant's youngest, until the two hold even shares; then it is refused."""
    q = PoolQueue()
    for i in range(6):
        q.push(Waiting("batch", "a", 0, 1.0, float(i)))
    youngest = q.victim(0, ("batch", "b"))
    assert youngest is not None and youngest.queued_at == 5.0
    for i in range(3):  # b takes three of a's places: 3 and 3
        w = q.victim(0, ("batch", "b"))
        assert w is not None and w.tenant == "a"
        q.remove(w)
        q.push(Waiting("batch", "b", 0, 1.0, 10.0 + i))
    assert q.victim(0, ("batch", "b")) is None  # even: the newcomer is refused
    assert q.victim(0, ("batch", "a")) is None  # its own flow is the biggest: refused


def test_a_lower_band_never_displaces_a_higher_one() -> None:
    """A full queue of band-7 requests refuses a band-0 newcomer (and a band-7 one of the
    same flow); a band-9 one displaces the youngest band-7."""
    q = PoolQueue()
    for i in range(4):
        q.push(Waiting("chat", "a", 7, 1.0, float(i)))
    assert q.victim(0, ("batch", "b")) is None
    assert q.victim(7, ("chat", "a")) is None
    w = q.victim(9, ("chat", "z"))
    assert w is not None and (w.band, w.queued_at) == (7, 3.0)
