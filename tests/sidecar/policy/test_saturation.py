"""Admission by a pool's saturation: obs.sidecar.policy.saturation's estimate (pure, with
hypothesis), the pool's one queue (bands, then weighted fair share; pure), and the pool gate
queueing, waking, timing out and holding a batch flood behind interactive requests."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from obs import conventions as c
from obs.config import Config, parse_config
from obs.config_blocks import Saturation
from obs.errors import ConfigError
from obs.sidecar.outcomes import Refusal
from obs.sidecar.policy import saturation as sat
from obs.sidecar.policy.pool_gate import Hold, PoolGate
from obs.sidecar.policy.pool_queue import PoolQueue, Waiting

POLICY = Saturation(max_waiting=2, hysteresis=1)


def _rep(waiting: float, running: float, kv: float | None = None) -> sat.ReplicaView:
    return sat.ReplicaView(True, waiting, running, kv)


def test_room_counts_free_slots_then_waiting() -> None:
    """New requests fill the running slots a replica has free, then its waiting queue up to
    the target, this process taking half that room until the next poll; its completions
    since the poll make room at once."""
    r = sat.room([_rep(0, 10)], POLICY, 16, 0, 0, 0.1, 3)
    assert (r.free, r.gate) == (4, sat.WAITING)  # half of 6 free slots + 2 waiting
    r = sat.room([_rep(0, 10)], POLICY, 16, 3, 0, 0.1, 3)
    assert r.free == 1  # three sent since the poll
    r = sat.room([_rep(3, 16)], POLICY, 16, 5, 5, 0.1, 3)
    assert r.free == -1 and r.waiting == 3
    r = sat.room([_rep(3, 16)], POLICY, 16, 3, 5, 0.1, 3)  # two of ours finished
    assert r.free == 1 and r.waiting == 1


def test_room_hysteresis_kv_stale_and_down() -> None:
    """A held pool reopens only ``hysteresis`` under its target; a KV-full replica has no free
    slots; a stale poll falls back to this process's own counts; no healthy replica, no room."""
    assert sat.room([_rep(1, 16)], POLICY, 16, 0, 0, 0.1, 3, held=True).free == 0
    assert sat.room([_rep(1, 16)], POLICY, 16, 0, 0, 0.1, 3, held=False).free == 1
    kv = Saturation(max_waiting=0, kv_cache_usage_max=0.9)
    r = sat.room([_rep(0, 4, kv=0.95)], kv, 16, 0, 0, 0.1, 3)
    assert (r.free, r.gate) == (0, sat.KV_CACHE)
    r = sat.room([_rep(50, 16)], POLICY, 16, 10, 0, 10.0, 3)
    assert (r.free, r.gate) == (8, sat.STALE)  # 16 + 2 - 10 of ours
    r = sat.room([sat.ReplicaView(False, 0, 0, None)], POLICY, 16, 0, 0, 0.1, 3)
    assert (r.free, r.gate) == (0, sat.NO_REPLICA)


@settings(max_examples=300, deadline=None)
@given(
    waiting=st.integers(0, 40),
    running=st.integers(0, 16),
    sent=st.integers(0, 40),
)
def test_filling_the_room_reaches_the_target(waiting: int, running: int, sent: int) -> None:
    """Sending exactly the room a fresh poll shows brings the estimated waiting queue to the
    target (never above it), whatever the pool held."""
    r = sat.room([_rep(waiting, running)], POLICY, 16, sent, sent, 0.1, 3)
    after = sat.room([_rep(waiting, running)], POLICY, 16, sent + max(0, r.free), sent, 0.1, 3)
    assert after.waiting <= POLICY.max_waiting or r.free <= 0
    assert after.free == min(0, r.free)


def _w(lane: str, tenant: str, band: int, t: float, weight: float = 1.0) -> Waiting:
    return Waiting(lane, tenant, band, weight, t)


def test_queue_serves_bands_first_then_oldest_in_flow() -> None:
    """The highest band goes first; inside a flow, the oldest request."""
    q = PoolQueue()
    for i in range(3):
        q.push(_w("batch", "a", 0, i))
    q.push(_w("chat", "a", 5, 10))
    q.push(_w("chat", "a", 5, 11))
    got = [q.pop() for _ in range(5)]
    assert [(w.lane, w.queued_at) for w in got if w] == [
        ("chat", 10), ("chat", 11), ("batch", 0), ("batch", 1), ("batch", 2),
    ]  # fmt: skip
    assert q.pop() is None and len(q) == 0


@settings(max_examples=150, deadline=None)
@given(
    offered=st.lists(st.integers(5, 60), min_size=2, max_size=4),
    weights=st.lists(st.sampled_from([1.0, 2.0, 3.0]), min_size=4, max_size=4),
)
def test_backlogged_flows_share_by_weight(offered: list[int], weights: list[float]) -> None:
    """Within a band, backlogged flows are served in proportion to their weights whatever
    each offers: over any prefix of the service, no flow gets more than one request beyond
    its weighted share."""
    q = PoolQueue()
    t = 0.0
    for i, n in enumerate(offered):
        for _ in range(n):
            q.push(_w(f"lane{i}", "t", 0, t, weights[i]))
            t += 1
    served = [0] * len(offered)
    while len(q):
        busy = [i for i in range(len(offered)) if served[i] < offered[i]]
        w = q.pop()
        assert w is not None
        i = int(w.lane.removeprefix("lane"))
        served[i] += 1
        total_w = sum(weights[j] for j in busy)
        share = sum(served[j] for j in busy) * weights[i] / total_w
        assert served[i] <= share + 1 + max(weights) / min(weights)


def test_views_by_lane_tenant_band() -> None:
    """The per-lane, per-tenant and per-band views count the one queue."""
    q = PoolQueue()
    q.push(_w("chat", "a", 5, 0))
    q.push(_w("batch", "a", 0, 1))
    q.push(_w("batch", "b", 0, 2))
    assert q.waiting_by("lane") == {"chat": 1, "batch": 2}
    assert q.waiting_by("tenant") == {"a": 2, "b": 1}
    assert q.waiting_by("band") == {"5": 1, "0": 2}


def _config(**sat_block: object) -> Config:
    return parse_config(
        {
            "pools": [
                {
                    "name": "p",
                    "replicas": ["http://127.0.0.1:9"],
                    "engine": {"kind": "sim", "max_num_seqs": 4},
                    "saturation": {"max_waiting": 0, "hysteresis": 0, **sat_block},
                }
            ],
            "lanes": [{"name": "chat", "pool": "p"}, {"name": "batch", "pool": "p"}],
            "default_lane": "chat",
            "tenants": {"big": {"weight": 3}},
        }
    )


def test_saturation_needs_max_num_seqs() -> None:
    """A pool admitted by saturation must declare its max_num_seqs: the error names it."""
    with pytest.raises(ConfigError, match="max_num_seqs"):
        parse_config(
            {
                "pools": [{"name": "p", "replicas": ["http://h:1"], "saturation": {}}],
                "lanes": [{"name": "l", "pool": "p"}],
                "default_lane": "l",
            }
        )


class Engine:
    """A pool replica's state as the poll would read it: the test plays the engine (no real
    engine can hold its running count still while the gate's bookkeeping is checked)."""

    def __init__(self) -> None:
        self.running = 0.0
        self.waiting = 0.0

    def view(self) -> tuple[list[sat.ReplicaView], float | None]:
        return [sat.ReplicaView(True, self.waiting, self.running, None)], 0.0


def test_batch_flood_cannot_delay_interactive() -> None:
    """With the pool full and a batch flood queued ahead, each interactive request (a higher
    band) is admitted at the next free slot: it waits for no batch request."""
    config = _config()
    engine = Engine()
    gate = PoolGate(config, config.pools[0], engine.view, 1.0)

    async def go() -> None:
        order: list[str] = []

        async def one(lane: str, band: int) -> None:
            if await gate.admit(lane, None, band, 30, Hold()):
                order.append(lane)

        gate.in_flight = 4  # four of ours fill the engine (4 slots, no waiting target)
        engine.running = 4
        gate.polled()
        flood = [asyncio.create_task(one("batch", 0)) for _ in range(20)]
        await asyncio.sleep(0.01)
        chat = [asyncio.create_task(one("chat", 7)) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert gate.queued == 23
        for _ in range(3):  # three slots free, one by one
            gate.release()
            await asyncio.sleep(0.01)
        assert order == ["chat", "chat", "chat"]
        for t in flood:
            t.cancel()
        await asyncio.gather(*flood, *chat, return_exceptions=True)

    asyncio.run(go())


def test_queue_full_and_timeout() -> None:
    """A saturated pool refuses past its max_queue (pool_queue_full) and after the lane's
    queue timeout (pool_queue_timeout); a withdrawn request leaves the queue."""
    config = _config(max_queue=1)
    engine = Engine()
    engine.running = 4
    gate = PoolGate(config, config.pools[0], engine.view, 1.0)

    async def go() -> None:
        hold = Hold()
        waiter = asyncio.create_task(gate.admit("chat", None, 0, 0.2, hold))
        await asyncio.sleep(0)
        assert hold.gate == sat.WAITING and gate.queued == 1
        full = await gate.admit("chat", None, 0, 1, Hold())
        assert isinstance(full, Refusal) and full.reason == c.POOL_QUEUE_FULL
        late = await waiter
        assert isinstance(late, Refusal) and late.reason == c.POOL_QUEUE_TIMEOUT
        assert gate.queued == 0
        hold = Hold()
        left = asyncio.create_task(gate.admit("chat", None, 0, 5, hold))
        await asyncio.sleep(0)
        gate.withdraw(hold)
        assert await left is False and gate.queued == 0

    asyncio.run(go())


def test_weighted_tenants_in_one_band() -> None:
    """Two tenants backlogged in one band: the one of weight 3 gets three slots for the
    other's one."""
    config = _config()
    engine = Engine()
    engine.running = 4
    gate = PoolGate(config, config.pools[0], engine.view, 1.0)

    async def go() -> None:
        order: list[str] = []

        async def one(tenant: str) -> None:
            if await gate.admit("batch", tenant, 0, 30, Hold()):
                order.append(tenant)

        gate.in_flight = 4  # the four running are ours
        gate.polled()
        tasks = [asyncio.create_task(one(t)) for t in ["small"] * 8 + ["big"] * 8]
        await asyncio.sleep(0)
        for _ in range(8):
            gate.release()
            await asyncio.sleep(0.01)
        assert sorted(order) == ["big"] * 6 + ["small"] * 2
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(go())
