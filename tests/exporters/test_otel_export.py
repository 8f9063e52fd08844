"""The span exporter: protobuf written directly, checked with opentelemetry-proto; faults."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from obs.conventions import PHASES
from obs.events import Event
from obs.exporters.otel import OtlpSettings, SpanExporter
from obs.exporters.otlp_http import OtlpPost
from obs.exporters.otlp_proto import attributes, export_request
from obs.phases import Clock
from obs.procs import free_port
from obs.record import Finished
from obs.sidecar.testing import OtlpReceiver
from obs.tracecontext import new_ids
from tests.support.probes import EventCounts

pytestmark = pytest.mark.inproc


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver().start()
    yield r
    r.stop()


def _finished(i: int, *, status: str = "ok", parent: str | None = None) -> Finished:
    traceparent = f"00-{'ab' * 16}-{'cd' * 8}-01" if parent else None
    ev = Event(
        request_id=f"r{i}",
        model="tiny",
        lane="chat",
        pool="small",
        status=status,
        stream=True,
        prompt_tokens=128,
        completion_tokens=80,
        max_tokens=-1,
        ttft_ms=21.5,
        finish_reason="length",
        error_class="UpstreamTimeout" if status != "ok" else None,
        error_phase="decode" if status != "ok" else None,
    )
    clock = Clock(received=1_000, dispatched=2_000, first_up=5_000, first_sent=6_000)
    clock.last_up, clock.end = 9_000, 10_000
    return Finished(ev, clock, 1_700_000_000_000_000_000, new_ids(traceparent))


def _settings(url: str, **kw: Any) -> OtlpSettings:
    return OtlpSettings(endpoint=url, schedule_delay_s=0.05, **kw)


def _decoded(receiver: OtlpReceiver) -> list[ExportTraceServiceRequest]:
    out = []
    for raw in receiver.raw:
        req = ExportTraceServiceRequest()
        req.ParseFromString(raw)
        out.append(req)
    return out


def test_spans_decode_with_the_reference_protobuf(receiver: OtlpReceiver) -> None:
    """A SERVER root with typed GenAI attributes, five INTERNAL phases tiling it, the resource."""
    exp = SpanExporter(_settings(receiver.url))
    f = _finished(1, parent="yes")
    exp.export(f)
    assert exp.force_flush(5)
    exp.shutdown(5)
    (req,) = _decoded(receiver)
    (rs,) = req.resource_spans
    resource = {kv.key: kv.value.string_value for kv in rs.resource.attributes}
    assert resource["service.name"] == "vllm-obs-sidecar"
    (ss,) = rs.scope_spans
    assert (ss.scope.name, ss.scope.version) == ("vllm_obs.sidecar", "0.1.0")
    root, *phases = ss.spans
    assert root.name == "chat tiny" and root.kind == 2
    assert root.trace_id.hex() == f"{f.ids.trace_id:032x}" == "ab" * 16
    assert root.span_id.hex() == f"{f.ids.span_id:016x}"
    assert root.parent_span_id.hex() == "cd" * 8
    assert root.flags == 0x300  # the parent is remote
    attrs = {kv.key: kv.value for kv in root.attributes}
    assert attrs["gen_ai.usage.output_tokens"].int_value == 80
    assert attrs["gen_ai.request.max_tokens"].int_value == -1
    assert attrs["vllm_obs.ttft_ms"].double_value == 21.5
    assert attrs["gen_ai.request.stream"].bool_value is True
    assert [v.string_value for v in attrs["gen_ai.response.finish_reasons"].array_value.values] == [
        "length"
    ]
    assert root.status.code == 0  # unset
    assert root.start_time_unix_nano == f.wall_start_ns
    assert root.end_time_unix_nano == f.wall_start_ns + 9_000
    assert [s.name for s in phases] == list(PHASES)
    t = root.start_time_unix_nano
    for s in phases:
        assert s.kind == 1 and s.parent_span_id == root.span_id and s.flags == 0x100
        assert s.start_time_unix_nano == t
        assert s.attributes[0].key == "vllm_obs.phase"
        t = s.end_time_unix_nano
    assert t == root.end_time_unix_nano
    assert len({s.span_id for s in ss.spans}) == 6


def test_failed_request_marks_root_and_failing_phase(receiver: OtlpReceiver) -> None:
    """An error sets ERROR with the error class on the root and on the phase it happened in only."""
    exp = SpanExporter(_settings(receiver.url))
    exp.export(_finished(1, status="upstream_error"))
    exp.shutdown(5)
    (req,) = _decoded(receiver)
    spans = {s.name: s for s in req.resource_spans[0].scope_spans[0].spans}
    assert spans["chat tiny"].status.code == 2
    assert spans["chat tiny"].status.message == "UpstreamTimeout"
    assert not spans["chat tiny"].parent_span_id  # no client traceparent: a root
    assert spans["decode"].status.code == 2
    assert all(spans[p].status.code == 0 for p in PHASES if p != "decode")


def test_attribute_values_round_trip() -> None:
    """UTF-8 strings, bools, big and negative ints, doubles and string lists keep type and value."""
    values: dict[str, Any] = {
        "s": "héllo",
        "t": True,
        "f": False,
        "i": 2**62,
        "n": -7,
        "d": -0.25,
        "a": ["x", "y"],
    }
    decoded = {}
    for raw in attributes(values):
        kv = KeyValue()
        kv.ParseFromString(raw)
        which = kv.value.WhichOneof("value") or ""
        v = getattr(kv.value, which)
        decoded[kv.key] = list(x.string_value for x in v.values) if which == "array_value" else v
    assert decoded == values


def test_batches_and_env_settings(receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch) -> None:
    """OTEL_* variables set headers, gzip and batch size; every request arrives, in batches."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20abc,x-tenant=t1")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "60")  # 10 requests of 6 spans
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100000")  # only full batches and flushes send
    settings = OtlpSettings.from_env()
    assert settings is not None and settings.gzip and settings.schedule_delay_s == 100.0
    counts = EventCounts()
    exp = SpanExporter(settings, counters=counts)
    for i in range(25):
        exp.export(_finished(i))
    deadline = time.monotonic() + 5
    while len(receiver.raw) < 2 and time.monotonic() < deadline:  # a full batch wakes the thread
        time.sleep(0.02)
    assert len(receiver.raw) >= 2  # long before the 100 s schedule delay
    exp.shutdown(5)
    sizes = [len(r.resource_spans[0].scope_spans[0].spans) for r in _decoded(receiver)]
    assert sum(sizes) == 150 and max(sizes) == 60
    assert counts.written == 25 and counts.dropped == {}
    h = receiver.headers[0]
    assert h["authorization"] == "Bearer abc" and h["x-tenant"] == "t1"
    assert h["content-encoding"] == "gzip" and h["content-type"] == "application/x-protobuf"


def test_a_full_batch_leaves_what_arrived_during_its_post_for_the_next(
    receiver: OtlpReceiver,
) -> None:
    """Requests queued while a full batch posts wait for the next full batch: two POSTs of 10."""
    receiver.hold = threading.Event()  # the collector answers only when the test says
    counts = EventCounts()
    settings = _settings(receiver.url, max_batch_spans=60)  # 10 requests a batch
    settings.schedule_delay_s = 100.0  # no timed write in this test
    exp = SpanExporter(settings, counters=counts)
    for i in range(10):
        exp.export(_finished(i))
    _until(lambda: receiver.held == 1)  # the full batch's POST waits at the collector
    for i in range(10, 13):
        exp.export(_finished(i))  # three arrive during that POST
    receiver.hold.set()
    _until(lambda: counts.written == 10)
    for i in range(13, 20):
        exp.export(_finished(i))  # with the three, the next full batch
    _until(lambda: counts.written == 20)
    exp.shutdown(5)
    sizes = [len(r.resource_spans[0].scope_spans[0].spans) for r in _decoded(receiver)]
    assert sizes == [60, 60]


def _until(done: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.005)


def test_retryable_refusal_is_retried(receiver: OtlpReceiver) -> None:
    """A 503 then a 200: the batch is sent again and counted written once."""
    receiver.refuse = [503]
    counts = EventCounts()
    exp = SpanExporter(_settings(receiver.url, timeout_s=5.0), counters=counts)
    exp.export(_finished(1))
    exp.shutdown(10)
    assert len(receiver.raw) == 1 and receiver.refuse == []
    assert counts.written == 1 and counts.dropped == {}


def test_unreachable_collector_counts_drops_and_recovers() -> None:
    """No collector: the batch is dropped and counted; once it is up, the next batch arrives."""
    port = free_port()
    counts = EventCounts()
    exp = SpanExporter(
        _settings(f"http://127.0.0.1:{port}/v1/traces", timeout_s=0.3), counters=counts
    )
    exp.export(_finished(1))
    assert exp.force_flush(5)
    assert counts.dropped == {"export_error": 1}
    late = OtlpReceiver(port).start()
    try:
        exp.export(_finished(2))
        exp.shutdown(5)
        assert len(late.spans) == 6 and counts.written == 1
    finally:
        late.stop()


def test_full_queue_drops_and_counts(receiver: OtlpReceiver) -> None:
    """Past OTEL_BSP_MAX_QUEUE_SIZE spans waiting, further requests are dropped and counted."""
    counts = EventCounts()
    settings = _settings(receiver.url, max_queue_spans=12, max_batch_spans=600)
    settings.schedule_delay_s = 100.0
    exp = SpanExporter(settings, counters=counts)
    for i in range(5):
        exp.export(_finished(i))
    assert counts.dropped == {"queue_full": 3}
    exp.shutdown(5)
    assert counts.written == 2 and len(receiver.spans) == 12


def test_posts_take_the_proxy_the_environment_names(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``http_proxy`` sends the POSTs through that proxy (none listens there: they fail), and
    ``no_proxy`` naming the collector's host sends them straight to it, as requests reads them."""
    for name in ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{free_port()}")
    settings = _settings(receiver.url, timeout_s=0.3)
    body = export_request({}, [])
    post = OtlpPost(settings, "otel", lambda: False)
    error = post(body)
    post.close()
    assert error is not None and error.startswith("ProxyError") and receiver.raw == []
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    post = OtlpPost(settings, "otel", lambda: False)
    assert post(body) is None and len(receiver.raw) == 1
    post.close()


def test_posts_carry_the_collectors_cookie_and_the_session_headers(
    receiver: OtlpReceiver,
) -> None:
    """A cookie the collector set (a sticky load balancer's) goes back with the next POSTs,
    each POST carries its own body's length, gzip and the session's headers as before."""
    receiver.set_cookie = "lb=replica-2; Path=/"
    settings = _settings(
        receiver.url, gzip=True, headers={"content-type": "application/x-protobuf"}
    )
    post = OtlpPost(settings, "otel", lambda: False)
    small, large = export_request({}, []), export_request({"service.name": "x" * 300}, [])
    assert post(small) is None and post(large) is None and post(small) is None
    post.close()
    assert [h.get("cookie") for h in receiver.headers] == [None, "lb=replica-2", "lb=replica-2"]
    assert receiver.raw == [small, large, small]
    for h in receiver.headers:
        assert h["content-encoding"] == "gzip" and h["content-type"] == "application/x-protobuf"
        assert h["user-agent"].startswith("python-requests/")
