"""Who held a replica: the occupancy by lane and the shares on each event (injected clock)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from obs import conventions as c
from obs.config import default_config_path, load_config
from obs.events import Event
from obs.phases import Clock
from obs.sidecar.pools.occupancy import Occupancy, OccupancyCollector
from obs.sidecar.pools.pools import PoolSet

S = 1_000_000_000  # ns


class Ticks:
    """The injected clock: ns, moved by the test."""

    def __init__(self) -> None:
        self.t = 0

    def __call__(self) -> int:
        return self.t


def _occupancy() -> tuple[Occupancy, Ticks]:
    ticks = Ticks()
    return Occupancy(("acme",), now=ticks), ticks


def test_others_share_is_the_time_integral_of_other_lanes_prompt_tokens() -> None:
    """A chat request waiting 2 s while a rag request held 300 of 400 prompt tokens for the
    first second, then alone: the others' share is 300 s-tokens over 400 + 100."""
    occ, ticks = _occupancy()
    rag_clock, chat_clock = Clock(received=0), Clock(received=0)
    rag_ev, chat_ev = Event(lane="rag"), Event(lane="chat")
    rag = occ.enter("rag", None, 300, rag_clock, rag_ev)
    chat = occ.enter("chat", None, 100, chat_clock, chat_ev)
    ticks.t = 1 * S
    rag_clock.first_up = 1 * S  # rag's first token: its 300 tokens leave the prefill
    ticks.t = 2 * S
    chat_clock.first_up = 2 * S
    occ.leave(rag)  # at 2 s: rag's first token (1 s) is caught up first
    ticks.t = 3 * S
    occ.leave(chat)
    assert chat_ev.pool_others_prompt_share == round(300 / 500, 4)
    # rag decoded from 1 s to 2 s, the only sequence decoding while chat waited
    assert chat_ev.pool_others_running_share == 1.0
    assert rag_ev.pool_others_prompt_share == round(100 / 400, 4)
    assert rag_ev.pool_others_running_share is None  # nothing decoded while rag waited


def test_a_lane_alone_holds_everything_itself() -> None:
    """Requests of one lane only: the others' share is 0, not null."""
    occ, ticks = _occupancy()
    a, b = Clock(received=0), Clock(received=0)
    ea = Event(lane="chat")
    ha = occ.enter("chat", None, 50, a, ea)
    hb = occ.enter("chat", None, 50, b, Event(lane="chat"))
    ticks.t = S
    occ.leave(hb)
    ticks.t = 2 * S
    occ.leave(ha)
    assert ea.pool_others_prompt_share == 0.0


def test_gauges_classify_by_first_token_and_bound_the_tenant_label() -> None:
    """The gauges show requests, prefill tokens and decoding per lane and tenant; a tenant the
    config does not name is '-'; a lane gone stays at 0."""
    occ, ticks = _occupancy()
    first, second, third = Clock(received=0), Clock(received=0), Clock(received=0)
    occ.enter("rag", "acme", 300, first, None)
    occ.enter("rag", "mallory", 200, second, None)
    gone = occ.enter("batch", None, 10, third, None)
    ticks.t = S
    occ.leave(gone)
    second.first_up = S
    rows = {(lane, tenant): (n, tok, seqs) for lane, tenant, n, tok, seqs in occ.by_lane()}
    assert rows == {
        ("rag", "acme"): (1, 300, 0),
        ("rag", c.OTHER_TENANT): (1, 0, 1),
        ("batch", c.OTHER_TENANT): (0, 0, 0),
    }


def test_sidecar_pools_export_occupancy_on_metrics() -> None:
    """A PoolSet's leases given a clock show on the occupancy gauges of its replica."""
    cfg = load_config(default_config_path())  # the shipped lanes
    pools = PoolSet(cfg)
    replica = pools.replicas["interactive"][0]
    reg = CollectorRegistry()
    reg.register(OccupancyCollector(pools.occupancies))
    ev = Event(lane="chat", pool="interactive")
    with replica.lease(120, ev, Clock(received=0)):
        page = generate_latest(reg).decode()
        want = (
            f'{c.OCCUPANCY_PREFILL_TOKENS.name}{{lane="chat",pool="interactive",'
            f'replica="{replica.url}",tenant="-"}} 120.0'
        )
        assert want in page
    assert ev.pool_others_prompt_share == 0.0
    page = generate_latest(reg).decode()
    assert f'{c.OCCUPANCY_REQUESTS.name}{{lane="chat"' in page and "} 0.0" in page
