"""``POST /v1/traces`` as an attacker would use it (issues 22 and 25), plus fuzzing.

A real sidecar process; the OTLP exports are built here with the OpenTelemetry
protobuf classes (what a forger would send; no vLLM sends these). The traced
pool is configured at 127.0.0.2 (loopback, nothing listening), so requests from
127.0.0.1 come from an address that is not a pool's. Where a request must be relayed,
the pool is ``ScriptedUpstream`` (no real vLLM can be made to send a forged span).
"""

from __future__ import annotations

import gzip
import time
import zlib

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from obs.procs import free_port
from obs.sidecar.testing import OtlpReceiver, SidecarProcess, llm_request_under
from obs.sidecar.testing import llm_request_export as export
from tests.conftest import SidecarFactory
from tests.support.probes import HealthProbe, metric, rss_bytes, stall_bound_s
from tests.support.scripted_upstream import ScriptedUpstream

TOKEN = "trace-token-for-tests"
AUTH = {"authorization": f"Bearer {TOKEN}", "content-type": "application/x-protobuf"}
REFUSED = "vllm_obs_trace_exports_refused_total"


@pytest.fixture
def traced(sidecar: SidecarFactory, monkeypatch: pytest.MonkeyPatch) -> SidecarProcess:
    """A sidecar whose pool (127.0.0.2) traces, with a token for other senders."""
    monkeypatch.setenv("VLLM_OBS_TEST_TRACES_TOKEN", TOKEN)  # the sidecar's environment
    return sidecar(
        f"http://127.0.0.2:{free_port()}",
        args=("--engine-traces", "--traces-token-env", "VLLM_OBS_TEST_TRACES_TOKEN"),
    )


def test_traces_route_is_closed_when_no_pool_traces(sidecar: SidecarFactory) -> None:
    """Without engine_traces, /v1/traces is 404 and nothing is forwarded (item 1)."""
    sc = sidecar(f"http://127.0.0.1:{free_port()}")
    r = httpx.post(sc.url + "/v1/traces", content=export(b"\x11" * 16), headers=AUTH)
    assert r.status_code == 404
    assert metric(sc.url, REFUSED, reason="closed") == 1


def test_only_pools_or_the_token_may_send_spans(traced: SidecarProcess) -> None:
    """From an address that is not a pool's, an export needs the token (item 1)."""
    body = export(b"\x12" * 16)
    ctype = {"content-type": "application/x-protobuf"}
    assert httpx.post(traced.url + "/v1/traces", content=body, headers=ctype).status_code == 403
    wrong = {**ctype, "authorization": "Bearer not-the-token"}
    assert httpx.post(traced.url + "/v1/traces", content=body, headers=wrong).status_code == 403
    assert httpx.post(traced.url + "/v1/traces", content=body, headers=AUTH).status_code == 200
    assert metric(traced.url, REFUSED, reason="source") == 2


def test_foreign_spans_are_not_forwarded_and_odd_encodings_are_refused(
    traced: SidecarProcess, otlp_receiver: OtlpReceiver
) -> None:
    """Spans of traces the sidecar never relayed stay out of the collector; br is 415 (item 1)."""
    trace = b"\x13" * 16
    r = httpx.post(traced.url + "/v1/traces", content=export(trace), headers=AUTH)
    assert r.status_code == 200
    br = {**AUTH, "content-encoding": "br"}
    r = httpx.post(traced.url + "/v1/traces", content=export(trace), headers=br)
    assert r.status_code == 415
    json = {**AUTH, "content-type": "application/json"}
    assert httpx.post(traced.url + "/v1/traces", content=b"{}", headers=json).status_code == 415
    time.sleep(1.0)  # the sidecar's exporter batches every 100 ms here
    assert otlp_receiver.trace(trace.hex()) == []


def _inflate(data: bytes) -> None:
    """Inflate gzip ``data`` in 16 MiB pieces, keeping none (the work a stalled loop does)."""
    d = zlib.decompressobj(31)
    while data:
        d.decompress(data, 16 << 20)
        data = d.unconsumed_tail


def test_a_decompression_bomb_is_refused_without_stalling_or_swelling(
    traced: SidecarProcess,
) -> None:
    """1 MB of gzip that inflates to 1 GB: 413, /health keeps answering, RSS stays low (item 3)."""
    z = zlib.compressobj(1, zlib.DEFLATED, 31)
    block = b"\0" * (16 << 20)
    bomb = b"".join(z.compress(block) for _ in range(64)) + z.flush()  # 1 GiB inflated
    bound_s = stall_bound_s(lambda: _inflate(bomb))
    with HealthProbe(traced.url) as probe:
        for _ in range(3):
            headers = {**AUTH, "content-encoding": "gzip"}
            r = httpx.post(traced.url + "/v1/traces", content=bomb, headers=headers, timeout=30)
            assert r.status_code == 413
    assert probe.slowest_s < bound_s
    assert rss_bytes(traced.pid) < 300 << 20
    assert metric(traced.url, REFUSED, reason="too_large") == 3


@pytest.mark.process
def test_many_early_spans_with_huge_attributes_are_not_kept(traced: SidecarProcess) -> None:
    """300 spans with 1 MB attributes for unknown requests leave no memory behind (item 3)."""
    before = rss_bytes(traced.pid)
    big = "x" * (1 << 20)
    with httpx.Client(timeout=30) as client:  # one client: a new one loads the CA bundle
        for i in range(300):
            body = export(i.to_bytes(16, "big"), **{"gen_ai.request.id": big})
            r = client.post(traced.url + "/v1/traces", content=body, headers=AUTH)
            assert r.status_code == 200
    assert rss_bytes(traced.pid) - before < 100 << 20
    assert metric(traced.url, "vllm_obs_engine_spans_total", result="unknown") == 300


_BODIES = st.one_of(
    st.binary(max_size=2048),
    st.binary(max_size=2048).map(gzip.compress),
    st.builds(
        lambda t, q, cut: export(t, **{"gen_ai.latency.time_in_queue": q})[:cut],
        st.binary(min_size=16, max_size=16),
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(0, 400),
    ),
)


@pytest.mark.process
@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(body=_BODIES, encoding=st.sampled_from(["", "gzip", "identity", "deflate"]))
def test_fuzzed_exports_never_fail_the_receiver(
    traced: SidecarProcess, body: bytes, encoding: str
) -> None:
    """Any bytes, any encoding: 200, 400, 413 or 415, never a 500; the sidecar stays up."""
    headers = {**AUTH, **({"content-encoding": encoding} if encoding else {})}
    r = httpx.post(traced.url + "/v1/traces", content=body, headers=headers, timeout=10)
    assert r.status_code in (200, 400, 413, 415)
    assert "Traceback" not in traced.log_tail()


def test_with_a_token_set_a_pools_own_address_needs_it_too(
    sidecar: SidecarFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A traced pool on 127.0.0.1, the token set: an export from 127.0.0.1 without it is 403."""
    monkeypatch.setenv("VLLM_OBS_TEST_TRACES_TOKEN", TOKEN)
    sc = sidecar(
        f"http://127.0.0.1:{free_port()}",
        args=("--engine-traces", "--traces-token-env", "VLLM_OBS_TEST_TRACES_TOKEN"),
    )
    ctype = {"content-type": "application/x-protobuf"}
    body = export(b"\x15" * 16)
    assert httpx.post(sc.url + "/v1/traces", content=body, headers=ctype).status_code == 403
    assert httpx.post(sc.url + "/v1/traces", content=body, headers=AUTH).status_code == 200
    assert metric(sc.url, REFUSED, reason="source") == 1


def test_a_span_in_a_trace_the_client_chose_is_forwarded_only_under_the_sidecars_span(
    sidecar: SidecarFactory, monkeypatch: pytest.MonkeyPatch, otlp_receiver: OtlpReceiver
) -> None:
    """A client names the trace (``traceparent``); its own span there is never forwarded, the
    engine's span under the sidecar's span is."""
    monkeypatch.setenv("VLLM_OBS_TEST_TRACES_TOKEN", TOKEN)
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    with ScriptedUpstream() as pool:
        sc = sidecar(
            pool.url,
            args=("--engine-traces", "--engine-join-wait", "0.2",
                  "--traces-token-env", "VLLM_OBS_TEST_TRACES_TOKEN"),
        )  # fmt: skip
        headers = {"traceparent": f"00-{trace}-00f067aa0ba902b7-01", "x-request-id": "chosen"}
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        r = httpx.post(sc.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
        assert r.status_code == 200
        ours = sc.events_of("chosen")[0]["span_id"]
        forged = llm_request_under(bytes.fromhex(trace), b"\x07" * 8, **{"vllm.forged": "yes"})
        engine = llm_request_under(bytes.fromhex(trace), bytes.fromhex(ours))
        for payload in (forged, engine):
            r = httpx.post(sc.url + "/v1/traces", content=payload, headers=AUTH)
            assert r.status_code == 200
        spans = otlp_receiver.wait_for(trace, ["llm_request"])
        time.sleep(0.5)  # the forged export was sent first: had it been forwarded, it is here
        llm = [s for s in otlp_receiver.trace(trace) if s.name == "llm_request"]
    assert spans
    assert [s.parent_span_id for s in llm] == [ours]
