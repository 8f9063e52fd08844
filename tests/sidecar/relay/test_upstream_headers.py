"""obs.sidecar.relay.payloads.upstream_headers: what the pool is sent besides the body."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from obs.sidecar.relay.payloads import upstream_headers

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_the_pools_own_key_replaces_the_clients_authorization() -> None:
    """A pool with an API key gets that key, never the client's."""
    h = upstream_headers({"authorization": "Bearer client"}, "r1", TP, "pool-key", True)
    assert h["authorization"] == "Bearer pool-key"


def test_the_clients_authorization_goes_on_only_when_the_sidecar_does_not_check_keys() -> None:
    """Without a pool key the client's authorization is passed through unless the sidecar
    checks API keys itself (then the key is the sidecar's, not the pool's)."""
    client = {"authorization": "Bearer client"}
    assert upstream_headers(client, "r1", TP, None, True)["authorization"] == "Bearer client"
    assert "authorization" not in upstream_headers(client, "r1", TP, None, False)


@given(
    st.dictionaries(
        st.sampled_from(["content-type", "accept", "tracestate", "x-other", "authorization"]),
        st.text(min_size=1, max_size=8),
    ),
    st.booleans(),
)
def test_ids_and_client_headers_go_on_as_the_relay_always_sent_them(
    headers: dict[str, str], pass_auth: bool
) -> None:
    """The request and trace ids are the relay's; content type and accept are the client's
    (JSON and any by default); tracestate goes on when sent; no other client header does."""
    h = upstream_headers(headers, "r1", TP, None, pass_auth)
    assert h["x-request-id"] == "r1" and h["traceparent"] == TP
    assert h["content-type"] == headers.get("content-type", "application/json")
    assert h["accept"] == headers.get("accept", "*/*")
    assert h.get("tracestate") == headers.get("tracestate")
    assert "x-other" not in h
    assert list(h)[:4] == ["content-type", "x-request-id", "traceparent", "accept"]
