"""The GenAI conventions over OTLP: metrics and log records sent to a real OTLP/HTTP receiver
(decoded with opentelemetry-proto), span attributes under OTEL_SEMCONV_STABILITY_OPT_IN."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from obs import conventions as c
from obs.config import Config, parse_config
from obs.events import Event
from obs.exporters.otlp_http import OtlpSettings, endpoint_from_env
from obs.exporters.otlp_logs import LogRecordExporter
from obs.exporters.otlp_metrics import GenAiMetricsExporter
from obs.exporters.otlp_proto import export_request
from obs.exporters.otlp_spans import request_spans
from obs.phases import Clock
from obs.record import Finished
from obs.sidecar.record.otlp import spans_of
from obs.sidecar.testing import OtlpReceiver, ReceivedPoint
from obs.tracecontext import TraceIds
from tests.support.probes import EventCounts

pytestmark = pytest.mark.inproc

REPLICA = "http://127.0.0.1:8001"
CONFIG: Config = parse_config(
    {
        "pools": [{"name": "small", "replicas": [REPLICA], "model": "tiny"}],
        "lanes": [{"name": "chat", "pool": "small"}],
        "default_lane": "chat",
    }
)
RESOURCE = {"service.name": "vllm-obs-test"}


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver().start()
    yield r
    r.stop()


def _finished(i: int, *, status: str = c.OK, ttft_ms: float = 21.5) -> Finished:
    ev = Event(
        request_id=f"r{i}",
        model="tiny",
        lane="chat",
        pool="small",
        replica=REPLICA,
        status=status,
        stream=True,
        prompt_tokens=100,
        completion_tokens=20,
        ttft_ms=ttft_ms,
        tpot_ms=30.0,
        e2e_ms=700.0,
        error_class="UpstreamTimeout" if status != c.OK else None,
    )
    clock = Clock(received=1_000, dispatched=2_000, first_up=5_000, first_sent=6_000)
    clock.last_up, clock.end = 9_000, 10_000
    return Finished(ev, clock, 1_700_000_000_000_000_000, TraceIds(0xA0 + i, 0xB0 + i, None, True))


def _latest(points: list[ReceivedPoint]) -> list[ReceivedPoint]:
    """Each series' last point (every export repeats every cumulative series)."""
    last = {tuple(sorted(p.attributes.items())): p for p in points}
    return list(last.values())


def _metrics(receiver: OtlpReceiver) -> GenAiMetricsExporter:
    settings = OtlpSettings(endpoint=receiver.metrics_url, schedule_delay_s=0.05)
    return GenAiMetricsExporter(settings, CONFIG, resource=RESOURCE)


def test_time_to_first_token_arrives_with_the_conventions_buckets_and_attributes(
    receiver: OtlpReceiver,
) -> None:
    """gen_ai.server.time_to_first_token: cumulative, the advised bounds, successful requests
    only, with operation, provider, models and server address/port as the conventions name."""
    exp = _metrics(receiver)
    for f in (_finished(1), _finished(2, ttft_ms=2_000.0), _finished(3, status=c.ERROR)):
        exp.export(f)
    assert exp.force_flush(10)
    exp.shutdown(5)
    point = receiver.points_of(c.GENAI_TIME_TO_FIRST_TOKEN.name)[-1]
    assert (point.unit, point.temporality) == ("s", 2)  # AGGREGATION_TEMPORALITY_CUMULATIVE
    assert point.explicit_bounds == list(c.GENAI_TIME_TO_FIRST_TOKEN.buckets)
    assert point.count == 2 and point.sum == pytest.approx(2.0215)
    counts = dict(zip([*point.explicit_bounds, "inf"], point.bucket_counts, strict=True))
    assert counts[0.04] == 1 and counts[2.5] == 1 and sum(counts.values()) == 2
    assert point.attributes == {
        c.ATTR_OPERATION: "chat",
        c.ATTR_PROVIDER: c.PROVIDER,
        c.ATTR_REQUEST_MODEL: "tiny",
        c.ATTR_RESPONSE_MODEL: "tiny",
        c.ATTR_SERVER_ADDRESS: "127.0.0.1",
        c.ATTR_SERVER_PORT: 8001,
        c.ATTR_LANE: "chat",
        c.ATTR_POOL: "small",
    }
    assert point.resource["service.name"] == "vllm-obs-test"


def test_duration_counts_failures_with_error_type_and_usage_splits_input_output(
    receiver: OtlpReceiver,
) -> None:
    """gen_ai.server.request.duration holds the failed request under error.type; token usage
    has one series per gen_ai.token.type; TPOT takes successful requests only."""
    exp = _metrics(receiver)
    exp.export(_finished(1))
    exp.export(_finished(2, status=c.ERROR))
    assert exp.force_flush(10)
    exp.shutdown(5)
    failed = receiver.points_of(
        c.GENAI_REQUEST_DURATION.name, **{c.ATTR_ERROR_TYPE: "UpstreamTimeout"}
    )
    assert failed[-1].count == 1 and failed[-1].explicit_bounds == list(
        c.GENAI_REQUEST_DURATION.buckets
    )
    assert receiver.points_of(c.GENAI_TIME_PER_OUTPUT_TOKEN.name)[-1].count == 1
    usage = _latest(receiver.points_of(c.GENAI_TOKEN_USAGE.name))
    by_type = {
        kind: sum(p.sum for p in usage if p.attributes[c.ATTR_TOKEN_TYPE] == kind)
        for kind in (c.TOKEN_INPUT, c.TOKEN_OUTPUT)
    }
    assert by_type == {c.TOKEN_INPUT: 200, c.TOKEN_OUTPUT: 40}
    assert all(c.ATTR_ERROR_TYPE not in p.attributes and p.unit == "{token}" for p in usage)


def test_metrics_are_cumulative_across_exports(receiver: OtlpReceiver) -> None:
    """A second export carries the first export's requests too (cumulative temporality)."""
    exp = _metrics(receiver)
    exp.export(_finished(1))
    assert exp.force_flush(10)
    exp.export(_finished(2))
    assert exp.force_flush(10)
    exp.shutdown(5)
    counts = [p.count for p in receiver.points_of(c.GENAI_TIME_TO_FIRST_TOKEN.name)]
    assert counts[0] == 1 and counts[-1] == 2


def test_metrics_endpoint_needs_its_own_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The generic OTLP endpoint turns traces on, not the GenAI metrics or the log records;
    the signal's own variable does."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    assert endpoint_from_env("traces") == "http://collector:4318/v1/traces"
    assert OtlpSettings.from_env(None, "metrics", generic=False) is None
    assert OtlpSettings.from_env(None, "logs", generic=False) is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m:4318/v1/metrics")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "1500")
    settings = OtlpSettings.from_env(None, "metrics", generic=False)
    assert settings is not None
    assert (settings.endpoint, settings.schedule_delay_s) == ("http://m:4318/v1/metrics", 1.5)


def test_events_arrive_as_log_records_with_trace_context(receiver: OtlpReceiver) -> None:
    """One record per request: the event's fields with a value as attributes, the request's
    trace and root span ids, its severity by outcome."""
    counts = EventCounts()
    settings = OtlpSettings(endpoint=receiver.logs_url, schedule_delay_s=0.05)
    exp = LogRecordExporter(settings, resource=RESOURCE, counters=counts)
    ok, failed = _finished(1), _finished(2, status=c.ERROR)
    exp.export(ok)
    exp.export(failed)
    assert exp.force_flush(10)
    exp.shutdown(5)
    records = {r.attributes["request_id"]: r for r in receiver.logs}
    assert set(records) == {"r1", "r2"} and counts.written == 2
    record = records["r1"]
    assert record.event_name == "vllm_obs.request"
    assert (record.trace_id, record.span_id) == (ok.ids.trace_id_hex, ok.ids.span_id_hex)
    assert record.flags == 1 and record.time_ns == ok.wall_start_ns
    want = {k: v for k, v in ok.event.to_dict().items() if v is not None}
    assert record.attributes == want
    assert (record.severity_number, record.severity_text) == (9, "INFO")
    assert records["r2"].severity_text == "ERROR"
    assert record.resource == RESOURCE and record.scope == "vllm_obs.sidecar"


def test_a_refused_log_export_is_counted_dropped(receiver: OtlpReceiver) -> None:
    """A collector that refuses the batch (400: no retry) costs the events, counted."""
    counts = EventCounts()
    receiver.refuse = [400]
    settings = OtlpSettings(endpoint=receiver.logs_url, schedule_delay_s=0.05)
    exp = LogRecordExporter(settings, resource=RESOURCE, counters=counts)
    exp.export(_finished(1))
    assert exp.force_flush(10)
    exp.shutdown(5)
    assert counts.dropped == {"export_error": 1} and receiver.logs == []


def _root(latest: bool) -> dict[str, object]:
    req = ExportTraceServiceRequest()
    req.ParseFromString(export_request(RESOURCE, [request_spans(_finished(1), latest)]))
    (root,) = [s for s in spans_of(req) if s.kind == 2]
    return root.attributes


def test_span_attributes_follow_the_pinned_conventions_and_the_opt_in() -> None:
    """Both modes have provider, response model, time to first chunk (s) and server address
    and port; gen_ai.system (v1.36.0 and before) only without the opt-in."""
    default, latest = _root(False), _root(True)
    for attrs in (default, latest):
        assert attrs[c.ATTR_PROVIDER] == c.PROVIDER
        assert attrs[c.ATTR_RESPONSE_MODEL] == "tiny"
        assert attrs[c.ATTR_TIME_TO_FIRST_CHUNK] == pytest.approx(0.0215)
        assert (attrs[c.ATTR_SERVER_ADDRESS], attrs[c.ATTR_SERVER_PORT]) == ("127.0.0.1", 8001)
    assert default[c.ATTR_SYSTEM] == c.PROVIDER
    assert c.ATTR_SYSTEM not in latest
    assert set(default) - set(latest) == {c.ATTR_SYSTEM}


@pytest.mark.parametrize(
    ("value", "latest"),
    [
        ("", False),
        ("http", False),
        ("gen_ai_latest_experimental", True),
        ("http, gen_ai_latest_experimental", True),
        ("gen_ai_latest", False),
    ],
)
def test_opt_in_reads_the_comma_separated_list(value: str, latest: bool) -> None:
    """OTEL_SEMCONV_STABILITY_OPT_IN is a comma-separated list; only the GenAI value counts."""
    assert c.latest_genai({c.OTEL_SEMCONV_STABILITY_OPT_IN: value}) is latest
