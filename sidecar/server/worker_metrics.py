"""Metrics across ``--workers`` processes: each worker's own page, saved and served privately,
merged at every scrape into one exposition (the rules: ``obs.sidecar.server.workers``' docstring).

Workers write their pages in OpenMetrics so the latency histograms' exemplars survive the
merge: a bucket's merged exemplar is the most recent of the workers' for that bucket."""

from __future__ import annotations

import contextlib
import hmac
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.openmetrics import parser as openmetrics_parser
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar

from obs import conventions as c
from obs.procs import loopback_session
from obs.sidecar.server.health_listener import BoundedServer

FETCH_TIMEOUT_S = 2.0
# Families every worker reads the same (pool polling, the config): taken once, not summed.
TAKEN_ONCE_PREFIXES = (
    f"{c.NAMESPACE}_pool_",
    c.LANE_INFO.name,
    c.CONFIG_INFO.name,
    c.RATE_LIMIT.name,  # the tenants' configured limits
    "process_start_time_seconds",  # the first worker's: summed, the times mean nothing
    "process_max_fds",  # each worker's limit, the same for all
)
COUNTING = ("counter", "histogram")  # what a dead worker's saved page still contributes
SAVE_EVERY_S = 1.0
SECRET_HEADER = "x-vllm-obs-worker-secret"
# One page generated and saved at a time in this process, so the saved file never goes back
# to an older page than one already saved or served.
_SAVE_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class WorkerSlot:
    """Who this process is among the workers, and where its siblings' metrics are."""

    index: int
    count: int
    metric_ports: tuple[int, ...]
    rundir: str  # saved pages: worker-I.prom, retired-*.prom
    secret: str = field(default="", repr=False)  # this start's: span hand-offs carry it

    def handoff_headers(self) -> dict[str, str]:
        """What a span hand-off to a sibling carries (``serve_private_metrics`` checks it)."""
        return {SECRET_HEADER: self.secret}

    @property
    def ids(self) -> tuple[int, int]:
        """(index, count): what names this worker's span ids (obs.tracecontext)."""
        return (self.index, self.count)

    def page_path(self, i: int) -> Path:
        return Path(self.rundir) / f"worker-{i}.prom"

    def own_page(self, registry: CollectorRegistry) -> bytes:
        """This worker's page, saved before it is returned (replaced in one step)."""
        with _SAVE_LOCK:
            page = openmetrics.generate_latest(registry)
            path = self.page_path(self.index)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(page)
            os.replace(tmp, path)
            return page

    def saved(self, i: int) -> str | None:
        try:
            return self.page_path(i).read_text()
        except OSError:
            return None

    def retired(self) -> list[str]:
        return [p.read_text() for p in sorted(Path(self.rundir).glob("retired-*.prom"))]


def merge_pages(pages: Sequence[str], retired: Sequence[str] = ()) -> list[Metric]:
    """One exposition from several workers' pages (see the module docstring for the rules).

    ``retired``: pages of workers that died, of which only counters and histograms count.
    """
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    exemplars: dict[tuple[str, tuple[tuple[str, str], ...]], Exemplar] = {}
    for page, dead in [(p, False) for p in pages] + [(p, True) for p in retired]:
        for fam in _families(page):
            if dead and (fam.type not in COUNTING or fam.name.startswith(TAKEN_ONCE_PREFIXES)):
                continue
            merged = families.get(fam.name)
            if merged is None:
                merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type)
                values[fam.name] = {}
            once = fam.name.startswith(TAKEN_ONCE_PREFIXES)
            vals = values[fam.name]
            for s in fam.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                if s.exemplar is not None and not dead:
                    seen = exemplars.get(key)
                    if seen is None or _when(s.exemplar) > _when(seen):
                        exemplars[key] = s.exemplar
                old = vals.get(key)
                if old is None:
                    vals[key] = s.value
                elif s.name.endswith("_created"):
                    vals[key] = min(old, s.value)
                elif not once:
                    vals[key] = old + s.value
    for name, fam in families.items():
        for key, value in values[name].items():
            fam.add_sample(key[0], dict(key[1]), value, exemplar=exemplars.get(key))
    return list(families.values())


def _when(exemplar: Exemplar) -> float:
    return 0.0 if exemplar.timestamp is None else float(exemplar.timestamp)


def _families(page: str) -> Iterable[Metric]:
    """A page's families: OpenMetrics (ends with ``# EOF``, exemplars kept) or the text format."""
    if page.rstrip().endswith("# EOF"):
        return openmetrics_parser.text_string_to_metric_families(page)
    return text_string_to_metric_families(page)


class MergedMetrics(Collector):
    """Every worker's registry, merged at each collection (this worker's read directly)."""

    def __init__(self, own: CollectorRegistry, slot: WorkerSlot) -> None:
        self.own = own
        self.slot = slot
        self._lock = threading.Lock()
        self._session = loopback_session()  # used under the lock only

    def _page(self, i: int) -> str | None:
        if i == self.slot.index:
            return self.slot.own_page(self.own).decode()
        url = f"http://127.0.0.1:{self.slot.metric_ports[i]}/metrics"
        try:
            r = self._session.get(url, timeout=FETCH_TIMEOUT_S)
            r.raise_for_status()
            return r.text
        except requests.RequestException:  # restarting or slow: its saved page
            return self.slot.saved(i)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            pages = [p for i in range(self.slot.count) if (p := self._page(i)) is not None]
            yield from merge_pages(pages, self.slot.retired())


def merged_registry(own: CollectorRegistry, slot: WorkerSlot) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(MergedMetrics(own, slot))
    return reg


MAX_HANDOFF_BYTES = 8 << 20
PRIVATE_TIMEOUT_S = 5.0  # for a sibling to send its request


def serve_private_metrics(
    sock: socket.socket,
    registry: CollectorRegistry,
    slot: WorkerSlot,
    spans: Callable[[bytes], bool] | None = None,
) -> ThreadingHTTPServer:
    """This worker's own page, for its siblings, on its pre-bound loopback socket; saved too.
    With ``spans``, ``POST /engine-spans`` takes the engine spans a sibling received for this
    worker's requests (obs.sidecar.record.span_handoff), only with ``slot.secret`` (403
    without). Bounded as the health listener is: each connection has ``PRIVATE_TIMEOUT_S``
    to send its request, and silent ones are shut for newcomers past its caps."""

    def save_often() -> None:
        while True:
            time.sleep(SAVE_EVERY_S)
            with contextlib.suppress(OSError):
                slot.own_page(registry)

    class Handler(BaseHTTPRequestHandler):
        timeout = PRIVATE_TIMEOUT_S

        def do_GET(self) -> None:
            body = slot.own_page(registry)
            self.send_response(200)
            self.send_header("content-type", openmetrics.CONTENT_TYPE_LATEST)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            given = self.headers.get(SECRET_HEADER, "").encode()
            if not slot.secret or not hmac.compare_digest(given, slot.secret.encode()):
                self.close_connection = True
                self.send_response(403)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            n = int(self.headers.get("content-length") or 0)
            ok = (
                spans is not None
                and self.path == "/engine-spans"
                and 0 < n <= MAX_HANDOFF_BYTES
                and spans(self.rfile.read(n))
            )
            self.send_response(204 if ok else 400)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return None

    server = BoundedServer(sock.getsockname(), Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    threading.Thread(target=server.serve_forever, daemon=True, name="worker-metrics").start()
    threading.Thread(target=save_often, daemon=True, name="worker-metrics-save").start()
    return server
