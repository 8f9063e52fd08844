"""obs.loadgen.confusion and obs.loadgen.clients, directly: the class x lane matrix, simulated
clients and the agent's tools."""

from __future__ import annotations

import asyncio
from typing import Any

from obs.loadgen.clients import Clients, build_body
from obs.loadgen.confusion import confusion
from obs.loadgen.mix import load_mix
from obs.loadgen.plan import PlannedRequest


def _pair(rid: str, cls: str, lane: str, client: str | None = None, at: float = 0.0):
    rec: dict[str, Any] = {"request_id": rid, "client_class": cls, "client": client}
    rec["offset_s"] = at
    return rec, {"request_id": rid, "lane": lane}


def test_the_matrix_counts_each_class_by_lane_and_its_own_share() -> None:
    """Rows are classes, columns the lanes seen; the own-lane share is per row."""
    pairs = [
        _pair("1", "rag", "rag"),
        _pair("2", "rag", "long-prefill"),
        _pair("3", "chat", "chat"),
    ]
    m = confusion(pairs)
    assert m is not None
    assert m.lanes == ("chat", "rag", "long-prefill")
    assert dict(m.rows) == {"chat": (1, 0, 0), "rag": (0, 1, 1)}
    assert m.own_share("rag") == 0.5 and m.own_share("chat") == 1.0
    assert "| rag | 0 | 1 | 1 | 50.0% |" in m.render()
    assert m.to_dict()["own_lane_share"]["rag"] == 0.5


def test_each_slow_clients_first_request_has_its_own_row() -> None:
    """A slow-stream client's earliest request is counted apart; other classes are not split."""
    pairs = [
        _pair("a2", "slow-stream", "slow-stream", "x", at=5.0),
        _pair("a1", "slow-stream", "chat", "x", at=1.0),
        _pair("b1", "slow-stream", "chat", "y", at=2.0),
        _pair("c1", "chat", "chat", "z", at=0.0),
    ]
    m = confusion(pairs)
    assert m is not None
    rows = dict(m.rows)
    assert rows["slow-stream"] == (0, 1) and rows["slow-stream (first)"] == (2, 0)
    assert rows["chat"] == (1, 0)
    assert m.own_share("slow-stream") == 1.0 and m.own_share("slow-stream (first)") == 0.0


def test_no_lanes_no_matrix() -> None:
    """Events without a lane give no matrix."""
    assert confusion([({"request_id": "1"}, {"request_id": "1"})]) is None


def _req(cls: str, session: int) -> PlannedRequest:
    return PlannedRequest(
        index=session, client_class=cls, session=session, turn=0, offset_s=0.0, think_s=0.0,
        prompt_tokens=10, max_tokens=10, stream=True,
    )  # fmt: skip


def test_simulated_clients_rotate_per_class_and_carry_their_own_key() -> None:
    """--clients 2: a class's sessions alternate between two opaque keys; no class header."""
    mix = load_mix()
    clients = Clients(mix, "run", class_header=False, clients=2, api_key=False)
    who = [clients.client(_req("slow-stream", s)) for s in (0, 1, 2, 3)]
    assert who[0] == who[2] != who[1] == who[3]
    assert clients.client(_req("chat", 4)) not in who
    headers = clients.headers(_req("slow-stream", 0), who[0])
    assert headers == {"Authorization": f"Bearer {who[0]}"}
    assert "slow" not in str(who[0])
    assert clients.turn(who[0]) is clients.turn(who[0])
    plain = Clients(mix, "run", class_header=True, clients=0, api_key=False)
    assert plain.client(_req("rag", 0)) is None
    assert plain.headers(_req("rag", 0), None) == {"X-Client-Class": "rag"}
    assert isinstance(plain.turn(None), asyncio.Lock)


def test_agent_requests_declare_tools_and_others_do_not() -> None:
    """build_body adds the mix's tool definitions (tool_choice none) to agent requests only."""
    opts = load_mix().request
    msgs = [{"role": "user", "content": "x"}]
    agent = build_body(_req("agent", 0), msgs, "m", opts, tools=3)
    assert len(agent["tools"]) == 3 and agent["tool_choice"] == "none"
    assert len({t["function"]["name"] for t in agent["tools"]}) == 3
    assert "tools" not in build_body(_req("chat", 0), msgs, "m", opts, tools=3)
    assert "tools" not in build_body(_req("agent", 0), msgs, "m", opts, tools=0)
