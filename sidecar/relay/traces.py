"""``POST /v1/traces``: the OTLP/HTTP receiver for the pools' request spans.

Closed (404) unless a pool has ``engine_traces``. Then an export is accepted
only:

- with ``Authorization: Bearer TOKEN`` where TOKEN is the value of
  ``--traces-token-env`` (compared in constant time), from any address, when the
  token is set; else from a traced pool's replica address (host names resolved at
  start-up, and again at most every ``RESOLVE_EVERY_S`` when a sender is not in the
  list: a container that started later or moved);
- as protobuf (``application/x-protobuf``), with no encoding, ``identity`` or
  ``gzip``;
- up to ``max_bytes`` both as sent and decompressed: the body is inflated by a
  bounded decompressor and decoded in a thread, at most ``DECODERS`` at a time,
  never on the event loop.

Its engines' request spans (vLLM's ``llm_request``, SGLang's and TGI's: see
``obs.engines.spans``) go to the engine join (``obs.sidecar.record.engine_join``),
which takes only spans of requests the sidecar itself sent. When the sidecar
exports spans (``OTEL_EXPORTER_OTLP_*``), the export is forwarded to the same
collector with only the spans the sidecar's own spans parent (the engine's
request span of a request the sidecar sent, and that span's descendants),
re-encoded as plain protobuf: nobody else, not even a client that chose its trace
id with ``traceparent``, can write into the operator's trace backend with its
credentials. Each refusal is counted by reason
(``vllm_obs_trace_exports_refused_total``).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import socket
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import structlog
from prometheus_client import CollectorRegistry, Counter

from obs import conventions as c
from obs.engines.spans import engine_of
from obs.sidecar.endings import outcome
from obs.sidecar.outcomes import TRACES, Refusal, Refused
from obs.sidecar.record.engine_join import EngineJoin
from obs.sidecar.record.otlp import ReceivedSpan, keep_traces, parse_export, spans_of
from obs.sidecar.relay.bodies import read_body
from obs.sidecar.types import Receive, Scope, Send

log = structlog.get_logger("vllm_obs.traces")

DECODERS = 2  # exports decoded at once; others wait before their body is read
MAX_TRACE_BYTES = 8 << 20
RESOLVE_EVERY_S = 30.0
REFUSALS = ("closed", "source", "method", "media_type", "encoding", "too_large", "invalid")
ForwardFn = Callable[[bytes], None]
HandOff = Callable[[list[ReceivedSpan]], Awaitable[list[ReceivedSpan]]]


def refusal_counter(registry: CollectorRegistry) -> Callable[[str], None]:
    """``vllm_obs_trace_exports_refused_total{reason}``, every reason from 0."""
    m = c.TRACE_EXPORTS_REFUSED
    counter = Counter(m.name, m.help, m.labels, registry=registry)
    children = {reason: counter.labels(reason) for reason in REFUSALS}
    return lambda reason: children[reason].inc()


@dataclass(frozen=True, slots=True)
class Decoded:
    spans: list[ReceivedSpan]  # the engines' request spans only (obs.engines.spans)
    forward: bytes | None  # the export with only our traces' spans, or None (nothing of ours)


def pool_addresses(urls: Iterable[str]) -> frozenset[str]:
    """The IP addresses of the replicas' hosts (names resolved once, at start-up)."""
    out: set[str] = set()
    for url in urls:
        host = urlsplit(url).hostname or ""
        try:
            out.add(str(ipaddress.ip_address(host)))
            continue
        except ValueError:
            pass
        try:
            infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        except OSError as err:
            log.warning("trace_source_unresolved", host=host, error=str(err))
            continue
        out.update(str(info[4][0]) for info in infos)
    return frozenset(out)


def inflate(raw: bytes, encoding: str, max_bytes: int) -> bytes:
    """The body as sent, decompressed to at most ``max_bytes`` (else ``Refused``)."""
    if encoding in ("", "identity"):
        return raw
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip
    try:
        out = d.decompress(raw, max_bytes + 1)
    except zlib.error as err:
        raise refused(400, "invalid", "the gzip body is corrupt") from err
    if len(out) > max_bytes or d.unconsumed_tail:
        raise refused(413, "too_large", f"the export inflates past {max_bytes} bytes")
    if not d.eof or d.unused_data:  # cut short, or more gzip members after the first
        raise refused(400, "invalid", "the body is not one whole gzip stream")
    return out


def decode(
    raw: bytes, encoding: str, max_bytes: int, ours: Callable[[str, str], bool], forward: bool
) -> Decoded:
    """Inflate, parse, pick the engines' request spans and our traces (runs in a thread)."""
    try:
        req = parse_export(inflate(raw, encoding, max_bytes))
        spans = [s for s in spans_of(req) if engine_of(s.name, s.attributes)]
    except Refused:
        raise
    except Exception as err:  # protobuf's errors, a recursion limit: all the sender's fault
        raise refused(400, "invalid", "not an OTLP trace export") from err
    out = None
    if forward and keep_traces(req, ours):
        out = req.SerializeToString()
    return Decoded(spans, out)


class TraceReceiver:
    """The ASGI handler of ``/v1/traces``."""

    def __init__(
        self,
        join: EngineJoin,
        *,
        replicas: tuple[str, ...] | None,
        token: str | None,
        forward: ForwardFn | None,
        refused: Callable[[str], None],
        max_bytes: int = MAX_TRACE_BYTES,
        hand_off: HandOff | None = None,
    ) -> None:
        self.join = join
        self.replicas = replicas  # the traced pools' replica URLs; None: closed
        self.sources = None if replicas is None else pool_addresses(replicas)
        self._resolved_at = time.monotonic()
        self.token = token.encode() if token else None
        self.forward = forward
        self.refused = refused
        self.max_bytes = max_bytes
        # Under --workers: sends the spans of requests another worker relayed to it, and
        # returns this worker's own (obs.sidecar.server.span_handoff).
        self.hand_off = hand_off
        self._decoders = asyncio.Semaphore(DECODERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            received = await self._receive(scope, receive)
        except Refused as err:
            self.refused(err.refusal.reason or "")
            answer = outcome(err.refusal)
            received = answer.status, answer.body()
        if received is None:  # the client left
            return
        status, body = received
        ctype = b"application/x-protobuf" if status == 200 else b"application/json"
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", ctype)]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})

    async def _check(self, scope: Scope, headers: dict[bytes, bytes]) -> str:
        if self.replicas is None:
            raise refused(404, "closed", "route not served by the vllm-obs sidecar")
        if not self._trusted(scope, headers) and not await self._trusted_now(scope, headers):
            raise refused(403, "source", "trace exports are accepted from the pools only")
        if scope["method"] != "POST":
            raise refused(405, "method", "POST OTLP/HTTP protobuf here")
        if not headers.get(b"content-type", b"").startswith(b"application/x-protobuf"):
            raise refused(415, "media_type", "only OTLP/HTTP protobuf is accepted")
        encoding = headers.get(b"content-encoding", b"").decode("latin-1").strip().lower()
        if encoding not in ("", "identity", "gzip"):
            raise refused(415, "encoding", "only gzip or identity content-encoding")
        return encoding

    def _trusted(self, scope: Scope, headers: dict[bytes, bytes]) -> bool:
        if self.token is not None:  # then the token, from every address (a pool's too)
            scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
            return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token)
        client = scope.get("client")
        return client is not None and self.sources is not None and client[0] in self.sources

    async def _trusted_now(self, scope: Scope, headers: dict[bytes, bytes]) -> bool:
        """Resolve the replicas' names again (rarely) and check once more."""
        if (
            self.replicas is None
            or self.token is not None
            or time.monotonic() - self._resolved_at < RESOLVE_EVERY_S
        ):
            return False
        self._resolved_at = time.monotonic()
        self.sources = await asyncio.to_thread(pool_addresses, self.replicas)
        return self._trusted(scope, headers)

    async def _receive(self, scope: Scope, receive: Receive) -> tuple[int, bytes] | None:
        headers: dict[bytes, bytes] = {}
        for k, v in scope["headers"]:
            headers.setdefault(k.lower(), v)
        encoding = await self._check(scope, headers)
        async with self._decoders:
            raw = await self._read(receive)
            if raw is None:
                return None
            decoded = await asyncio.to_thread(
                decode, raw, encoding, self.max_bytes, self.join.knows_parent,
                self.forward is not None,
            )  # fmt: skip
        spans = decoded.spans
        if self.hand_off is not None and spans:
            spans = await self.hand_off(spans)
        for span in spans:
            self.join.on_span(span)
        if decoded.forward is not None and self.forward is not None:
            self.forward(decoded.forward)
        return 200, b""

    async def _read(self, receive: Receive) -> bytes | None:
        try:
            return await read_body(receive, self.max_bytes)
        except Refused as err:  # past max_bytes
            raise refused(413, "too_large", f"the export is over {self.max_bytes} bytes") from err


def refused(status: int, reason: str, message: str) -> Refused:
    """The trace route's refusal (``reason``: its refusal counter's label)."""
    return Refused(Refusal(status, message, reason, TRACES))
