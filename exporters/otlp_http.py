"""OTLP/HTTP (protobuf) for the three signals the sidecar sends: where, how, and the POST.

The standard variables keep their meaning for each signal: ``OTEL_EXPORTER_OTLP_<SIGNAL>_*``
first, then ``OTEL_EXPORTER_OTLP_*`` (endpoint, headers, timeout, compression, certificates).
The batch settings are each signal's own: ``OTEL_BSP_*`` for spans, ``OTEL_BLRP_*`` for log
records, ``OTEL_METRIC_EXPORT_INTERVAL`` for metrics. ``OtlpPost`` sends one body with
retries (429/502/503/504 and connection errors, backoff, up to the timeout); it runs on an
exporter's own thread, never on the event loop.
"""

from __future__ import annotations

import gzip
import os
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Final, Literal, Protocol, cast

import requests
import structlog
from opentelemetry.sdk.resources import Resource
from opentelemetry.util.re import parse_env_headers

from obs.exporters.otlp_direct import DirectPost, Redirected, direct
from obs.exporters.otlp_proto import AttrValue

log = structlog.get_logger("vllm_obs.otlp")

Signal = Literal["traces", "metrics", "logs"]
RETRYABLE: Final = frozenset({429, 502, 503, 504})
# Per signal: the variable that turns it off, and its batch settings (variable, default).
_EXPORTER_VAR: Final = {
    "traces": "OTEL_TRACES_EXPORTER",
    "metrics": "OTEL_METRICS_EXPORTER",
    "logs": "OTEL_LOGS_EXPORTER",
}
_DELAY_MS: Final = {
    "traces": ("OTEL_BSP_SCHEDULE_DELAY", 5000.0),
    "logs": ("OTEL_BLRP_SCHEDULE_DELAY", 1000.0),
    "metrics": ("OTEL_METRIC_EXPORT_INTERVAL", 60000.0),
}
_QUEUE: Final = {"traces": "OTEL_BSP_MAX_QUEUE_SIZE", "logs": "OTEL_BLRP_MAX_QUEUE_SIZE"}
_BATCH: Final = {
    "traces": "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
    "logs": "OTEL_BLRP_MAX_EXPORT_BATCH_SIZE",
}


@cache
def _resource() -> dict[str, AttrValue]:
    res = Resource.create({"service.name": "vllm-obs-sidecar"})
    attrs = cast(dict[str, AttrValue], dict(res.attributes))  # the SDK-validated kinds
    attrs.setdefault("service.instance.id", str(uuid.uuid4()))
    return attrs


def default_resource() -> dict[str, AttrValue]:
    """The resource of everything this process sends: ``OTEL_SERVICE_NAME`` and
    ``OTEL_RESOURCE_ATTRIBUTES`` (service name ``vllm-obs-sidecar`` by default), and a
    ``service.instance.id`` unique to the process unless those set one: each ``--workers``
    process sends its own cumulative metric streams, which must not collide. One per process
    (a fork, as ``--workers`` makes, has not built it yet: the supervisor sends nothing)."""
    return dict(_resource())


def endpoint_from_env(signal: Signal = "traces", *, generic: bool = True) -> str | None:
    """The OTLP/HTTP URL the standard variables name for ``signal``, or None (unset or off).

    ``generic``: ``OTEL_EXPORTER_OTLP_ENDPOINT`` (plus ``/v1/<signal>``) counts too.
    """
    if os.environ.get(_EXPORTER_VAR[signal], "otlp").lower() == "none":
        return None
    if url := os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"):
        return url
    if generic and (url := os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
        return url.rstrip("/") + f"/v1/{signal}"
    return None


def _env(signal: Signal, name: str, default: str = "") -> str:
    """``OTEL_EXPORTER_OTLP_<SIGNAL>_<name>``, else ``OTEL_EXPORTER_OTLP_<name>``."""
    return (
        os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_{name}")
        or os.environ.get(f"OTEL_EXPORTER_OTLP_{name}")
        or default
    )


def _number(raw: str, name: str, default: float) -> float:
    """``raw`` (the value of variable ``name``) as a number; ``default`` if unset or invalid."""
    try:
        return float(raw) if raw else default
    except ValueError:
        log.warning("invalid_otel_setting", variable=name, value=raw, using=default)
        return default


def _var(name: str, default: float) -> float:
    return _number(os.environ.get(name, ""), name, default)


@dataclass
class OtlpSettings:
    """Where and how one signal is sent; ``from_env`` reads the standard OTEL_* variables.

    ``max_queue_spans`` and ``max_batch_spans`` are items of the signal (spans, log records).
    """

    endpoint: str
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 10.0
    gzip: bool = False
    verify: str | bool = True  # a CA bundle path, or the system's
    client_cert: tuple[str, str] | None = None
    schedule_delay_s: float = 5.0
    max_queue_spans: int = 2048
    max_batch_spans: int = 512

    @classmethod
    def from_env(
        cls, endpoint: str | None = None, signal: Signal = "traces", *, generic: bool = True
    ) -> OtlpSettings | None:
        """``endpoint`` (else the variables') with the variables' settings; None: no endpoint."""
        url = endpoint or endpoint_from_env(signal, generic=generic)
        if not url:
            return None
        compression = _env(signal, "COMPRESSION", "none").strip().lower()
        if compression not in ("none", "gzip"):
            log.warning("invalid_otel_setting", variable="COMPRESSION", value=compression)
        cert, key = _env(signal, "CLIENT_CERTIFICATE"), _env(signal, "CLIENT_KEY")
        headers = parse_env_headers(_env(signal, "HEADERS"), liberal=True)
        delay_var, delay_ms = _DELAY_MS[signal]
        return cls(
            endpoint=url,
            headers={"content-type": "application/x-protobuf"}
            | {k.lower(): v for k, v in headers.items()},
            timeout_s=_number(
                _env(signal, "TIMEOUT"), f"OTEL_EXPORTER_OTLP_[{signal.upper()}_]TIMEOUT", 10.0
            ),
            gzip=compression == "gzip",
            verify=_env(signal, "CERTIFICATE") or True,
            client_cert=(cert, key) if cert and key else None,
            schedule_delay_s=_var(delay_var, delay_ms) / 1000,
            max_queue_spans=int(_var(_QUEUE[signal], 2048)) if signal in _QUEUE else 2048,
            max_batch_spans=int(_var(_BATCH[signal], 512)) if signal in _BATCH else 512,
        )


class Counters(Protocol):
    def event_written(self, exporter: str, n: int) -> None: ...

    def event_dropped(self, exporter: str, reason: str, n: int) -> None: ...


class OtlpPost:
    """POSTs protobuf bodies to one endpoint with retries (call it from one thread)."""

    def __init__(
        self,
        settings: OtlpSettings,
        exporter: str,
        stopping: Callable[[], bool],
        counters: Counters | None = None,
    ) -> None:
        """``stopping()``: True once the exporter shuts down (a failing collector then gets no
        more retries); ``counters`` count the events each ``send`` carried."""
        self.settings = settings
        self.exporter = exporter
        self.failing = False
        self._stopping = stopping
        self._counters = counters
        self._session = session = requests.Session()
        # ``session.post`` as it was, less what it redid on every call: what ``Session.request``
        # reads from the environment (the proxies for the endpoint, ``REQUESTS_CA_BUNDLE``,
        # ~/.netrc; ``getproxies_environment`` walks ``os.environ`` twice) is read once, and
        # the request (the session's headers and these, the netrc credentials) is prepared
        # once and copied for each body: 400 against 200 µs of CPU a POST (``bench.otlp_post``).
        env = session.merge_environment_settings(
            settings.endpoint, {}, None, settings.verify, settings.client_cert
        )
        self._proxies, self._verify, self._cert = env["proxies"], env["verify"], env["cert"]
        session.auth = requests.utils.get_netrc_auth(settings.endpoint)
        session.trust_env = False
        headers = settings.headers
        if settings.gzip:
            headers = headers | {"content-encoding": "gzip"}
        self._request = session.prepare_request(
            requests.Request("POST", settings.endpoint, headers=headers, data=b"")
        )
        # A plain ``http://`` endpoint no proxy applies to: the same request straight through
        # ``http.client`` on a kept-alive connection (``otlp_direct``), ~100 against ~280 µs.
        self._direct: DirectPost | None = direct(session, self._request, self._proxies)

    def send(self, body: bytes, events: int) -> bool:
        """POST ``body`` (holding ``events`` events): counted written or dropped, and a failure
        streak logged once, at its start and at its end."""
        error = self(body)
        if error is None:
            if self._counters is not None and events:
                self._counters.event_written(self.exporter, events)
            if self.failing:
                log.info(
                    "otlp_export_recovered", exporter=self.exporter, endpoint=self.settings.endpoint
                )
            self.failing = False
            return True
        if self._counters is not None and events:
            self._counters.event_dropped(self.exporter, "export_error", events)
        if not self.failing:
            log.warning(
                "otlp_export_failed",
                exporter=self.exporter,
                endpoint=self.settings.endpoint,
                error=error,
            )
        self.failing = True
        return False

    def __call__(self, body: bytes) -> str | None:
        """None when the collector took ``body``, else why not (after the retries)."""
        s = self.settings
        if s.gzip:
            body = gzip.compress(body, compresslevel=6)
        deadline = time.monotonic() + s.timeout_s
        backoff = 0.5
        while True:
            timeout_s = max(deadline - time.monotonic(), 0.1)
            if (fast := self._direct) is None:
                error, status = self._send(body, timeout_s)
            else:
                try:
                    error, status = fast(body, timeout_s)
                except Redirected:  # ``requests`` follows redirects: it sends from now on
                    fast.close()
                    self._direct = None
                    continue
            if error is None:
                return None
            if status and status not in RETRYABLE:
                return error
            pause = backoff * random.uniform(0.8, 1.2)
            if (self._stopping() and self.failing) or time.monotonic() + pause >= deadline:
                return error
            time.sleep(pause)
            backoff *= 2

    def _send(self, body: bytes, timeout_s: float) -> tuple[str | None, int]:
        """One POST through ``requests``: (None, status), (the refusal, status) or (why, 0)."""
        session = self._session
        request = self._request.copy()
        request.prepare_body(body, None)
        if session.cookies:  # what the collector set (a sticky load balancer's) goes back
            request.prepare_cookies(session.cookies)
        try:
            resp = session.send(
                request,
                timeout=timeout_s,
                proxies=self._proxies,
                verify=self._verify,
                cert=self._cert,
            )
        except requests.RequestException as e:
            return f"{type(e).__name__}: {e}", 0
        if resp.status_code < 300:
            return None, resp.status_code
        return f"HTTP {resp.status_code}: {resp.text[:200]}", resp.status_code

    def close(self) -> None:
        if self._direct is not None:
            self._direct.close()
        self._session.close()
