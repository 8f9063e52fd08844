"""obs.sidecar.server.budgets: connection and body-memory budgets, in total and per address."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from obs.sidecar.server.budgets import Budgets

ADDRS = st.sampled_from(["10.0.0.1", "10.0.0.2", "10.0.0.3"])


@given(st.lists(st.tuples(st.booleans(), ADDRS), max_size=200))
def test_connections_never_pass_either_budget(ops: list[tuple[bool, str]]) -> None:
    """Whatever connects and leaves, the total and each address stay within their caps,
    and a refusal names the cap that was full."""
    b = Budgets(10, 4, 0, 0)
    held: dict[str, int] = {}
    for join, addr in ops:
        if join:
            over = b.connect(addr)
            if over is None:
                held[addr] = held.get(addr, 0) + 1
            else:
                full = sum(held.values()) >= 10
                assert over == ("max_connections" if full else "client_connections")
                assert full or held.get(addr, 0) >= 4
        elif held.get(addr):
            b.disconnect(addr)
            held[addr] -= 1
        assert b.connections == sum(held.values()) <= 10
        assert all(b.client_connections(a) == n <= 4 for a, n in held.items())


@given(st.lists(st.tuples(ADDRS, st.integers(1, 60)), max_size=100))
def test_body_bytes_never_pass_either_budget_and_are_freed(ops: list[tuple[str, int]]) -> None:
    """Held body bytes stay within 100 in all and 40 per address; freeing returns them all."""
    b = Budgets(0, 0, 100, 40)
    held: dict[str, int] = {}
    for addr, n in ops:
        if b.hold_body(addr, n):
            held[addr] = held.get(addr, 0) + n
        else:
            assert sum(held.values()) + n > 100 or held.get(addr, 0) + n > 40
        assert b.body_bytes == sum(held.values()) <= 100
        assert all(n <= 40 for n in held.values())
    for addr, n in held.items():
        b.free_body(addr, n)
    assert b.body_bytes == 0
    assert b.hold_body("10.0.0.1", 40)
