"""The OTLP metrics and logs flags on a real sidecar process, against the session's real OTLP
receiver; no engine is needed: a request to a closed port fails, and is recorded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from obs import conventions as c
from obs.procs import free_port
from obs.sidecar.testing import OtlpReceiver
from tests.conftest import SidecarFactory
from tests.support.probes import wait_for

pytestmark = pytest.mark.process


def test_flags_send_genai_metrics_and_event_log_records(
    sidecar: SidecarFactory, otlp_receiver: OtlpReceiver
) -> None:
    """--otlp-metrics-endpoint: the failed request's duration arrives with its error.type (the
    last export, at shutdown); --otlp-logs-endpoint: its event arrives as a log record in its
    trace."""
    port = free_port()
    sc = sidecar(
        f"http://127.0.0.1:{port}",
        args=(
            "--otlp-metrics-endpoint", otlp_receiver.metrics_url,
            "--otlp-logs-endpoint", otlp_receiver.logs_url,
        ),
    )  # fmt: skip
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    r = httpx.post(sc.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code >= 500
    (event,) = sc.wait_events(1)
    record = wait_for(
        "the event's log record",
        lambda: otlp_receiver.logs_of(request_id=event["request_id"]),
        timeout_s=20,
    )[0]
    assert record.trace_id == event["trace_id"] and record.attributes["status"] == event["status"]
    sc.stop()  # the metrics exporter's last export
    points = otlp_receiver.points_of(c.GENAI_REQUEST_DURATION.name, **{c.ATTR_SERVER_PORT: port})
    point = points[-1]  # cumulative: the last export holds every request
    assert point.count == 1
    assert point.attributes[c.ATTR_ERROR_TYPE] == event["error_class"]
    assert point.attributes[c.ATTR_LANE] == event["lane"]


def test_a_malformed_otlp_endpoint_flag_is_a_clear_error(tmp_path: Path) -> None:
    """--otlp-logs-endpoint that is no http(s) URL stops the start with one line, no traceback."""
    r = subprocess.run(
        [sys.executable, "-m", "obs.cli", "sidecar", "--upstream", "http://127.0.0.1:9",
         "--port", str(free_port()), "--events", str(tmp_path / "e.jsonl"),
         "--otlp-logs-endpoint", "collector:4318"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2
    assert "--otlp-logs-endpoint: 'collector:4318' is not an http(s) URL" in r.stderr
    assert "Traceback" not in r.stderr
