"""obs.sidecar.policy.recognition, directly: recent prefixes, client identity, slow-reader
learning."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from obs import conventions as c
from obs.events import Event
from obs.matching import Recognition
from obs.sidecar.policy.recognition import (
    PREFIX_CHARS,
    RecentPrefixes,
    Recognizer,
    SlowReaders,
    client_id,
    leading_key,
)


def _stream(stream_ms: float = 0.0, blocked_ms: float = 0.0, status: str = c.OK) -> Event:
    return Event(stream=True, status=status, stream_ms=stream_ms, stream_blocked_ms=blocked_ms)


def test_a_prefix_is_seen_the_second_time_and_forgotten_past_the_bound() -> None:
    """seen() is false the first time, true after; the least recently seen goes first."""
    recent = RecentPrefixes(2)
    assert [recent.seen(k) for k in ("a", "a", "b", "a", "c")] == [False, True, False, True, False]
    assert recent.seen("a")  # kept: seen more recently than b
    assert not recent.seen("b")  # forgotten when c came
    assert not recent.seen(None)


@given(st.lists(st.sampled_from("abcdefgh"), max_size=60), st.integers(1, 5))
def test_recent_prefixes_behave_as_an_lru_of_their_size(keys: list[str], size: int) -> None:
    """seen(k) is true exactly when k is among the ``size`` most recent distinct keys."""
    recent = RecentPrefixes(size)
    order: list[str] = []
    for k in keys:
        assert recent.seen(k) == (k in order[-size:])
        if k in order:
            order.remove(k)
        order.append(k)


def test_the_leading_key_covers_the_first_prefix_chars_of_text_only() -> None:
    """Two prompts with the same first PREFIX_CHARS characters share a key; short ones have none."""
    doc = "d" * PREFIX_CHARS
    a = {"messages": [{"role": "system", "content": doc}, {"role": "user", "content": "q1"}]}
    b = {"messages": [{"role": "system", "content": doc[:100]}, {"role": "user", "content": doc}]}
    c2 = {"messages": [{"role": "user", "content": "e" + doc}]}
    assert leading_key(a) is not None
    assert leading_key(a) == leading_key(b) == leading_key({"prompt": doc + "tail"})
    assert leading_key(a) != leading_key(c2)
    assert leading_key({"messages": [{"role": "user", "content": "short"}]}) is None


def test_client_identity_follows_the_configured_choice_and_falls_back_to_the_address() -> None:
    """api_key hashes Authorization; tenant uses the tenant; without them, the address."""
    auth = {"authorization": "Bearer sk-secret"}
    key = client_id("api_key", auth, "t", ("10.0.0.1", 5))
    assert key is not None and key.startswith("k:") and "sk-secret" not in key
    assert client_id("api_key", {}, "t", ("10.0.0.1", 5)) == "a:10.0.0.1"
    assert client_id("tenant", auth, "t", ("10.0.0.1", 5)) == "t:t"
    assert client_id("address", auth, "t", ("10.0.0.1", 5)) == "a:10.0.0.1"
    assert client_id("tenant", {}, None, None) is None


def test_a_slow_stream_teaches_and_fast_ones_in_a_row_unteach() -> None:
    """A stream read past slow_stream_ms marks the client; two fast streams in a row clear it,
    a slow one between them starts the count again."""
    readers = SlowReaders(Recognition(slow_stream_ms=500, fast_streams_to_forget=2))
    readers.observe("x", _stream(stream_ms=499))
    assert "x" not in readers
    readers.observe("x", _stream(stream_ms=2000))
    assert "x" in readers
    readers.observe("x", _stream(status=c.DISCONNECTED))  # no verdict from a cut stream
    readers.observe("x", _stream(blocked_ms=10))
    assert "x" in readers  # one fast stream: maybe the pool was slow that time
    readers.observe("x", _stream(stream_ms=700))
    readers.observe("x", _stream())
    assert "x" in readers
    readers.observe("x", _stream())
    assert "x" not in readers
    readers.observe("y", _stream(blocked_ms=600))
    assert "y" in readers
    readers.observe(None, _stream(stream_ms=9000))
    assert len(readers) == 1


def test_learned_clients_are_bounded_and_exported_as_a_gauge() -> None:
    """Past max_clients the least recently seen client is forgotten; the gauge shows the count."""
    registry = CollectorRegistry()
    rec = Recognizer(Recognition(slow_stream_ms=100, max_clients=3), registry)
    for who in "abcd":
        rec.slow.observe(who, _stream(stream_ms=1000))
    assert "a" not in rec.slow and all(w in rec.slow for w in "bcd")
    assert registry.get_sample_value(c.SLOW_READERS.name) == 3
    rec.decided("chat", "rule")
    assert (
        registry.get_sample_value(c.CLASSIFIED.name + "_total", {"lane": "chat", "source": "rule"})
        == 1
    )


def test_a_respelt_key_is_the_same_slow_reader() -> None:
    """`Bearer k`, `bearer k` and `BEARER   k ` are one client: respelling does not escape."""
    spellings = ("Bearer sk-1", "bearer sk-1", "BEARER   sk-1 ", " Bearer sk-1")
    ids = {client_id("api_key", {"authorization": a}, None, ("10.0.0.1", 5)) for a in spellings}
    assert len(ids) == 1
    assert client_id("api_key", {"authorization": "Bearer sk-2"}, None, None) not in ids


def test_a_header_tenant_is_learned_with_its_address() -> None:
    """A tenant named by an unchecked header counts with the address that sent it: an attacker
    naming the victim's tenant from elsewhere teaches nothing about the victim."""
    victim = client_id("tenant", {}, "gold", ("10.0.0.1", 5), tenant_checked=False)
    attacker = client_id("tenant", {}, "gold", ("10.0.0.66", 5), tenant_checked=False)
    assert victim != attacker
    assert client_id("tenant", {}, "gold", ("10.0.0.66", 5), tenant_checked=True) == "t:gold"
    readers = SlowReaders(Recognition(slow_stream_ms=100))
    readers.observe(attacker, _stream(stream_ms=5000))
    assert attacker in readers and victim not in readers


def test_refused_requests_cannot_evict_a_remembered_prefix() -> None:
    """has() reads without remembering: 4,200 unique prefixes that are only looked up (refused
    requests) leave a victim's document remembered; remember() is what keeps one."""
    recent = RecentPrefixes(1000)
    recent.remember("victim-doc")
    for i in range(4200):
        assert not recent.has(f"attacker-{i}")
    assert recent.has("victim-doc")
