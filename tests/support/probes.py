"""Looking at a running sidecar from outside: metrics, SSE frames, open files and sockets.

Shared by the fault, fuzz and soak tests. Everything here reads what a real
process exposes (``/metrics``, ``/proc``); nothing reaches into the sidecar.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import orjson
import yaml

from obs.demo.prometheus import EXEMPLAR_STORAGE, PrometheusProcess
from obs.procs import free_port
from obs.prom.api import Samples, parse_samples, sample_sum, scrape  # noqa: F401 (re-exported)

T = TypeVar("T")

DONE_FRAME = b"data: [DONE]\n\n"
_TCP_STATES = {"01": "ESTABLISHED", "06": "TIME_WAIT", "08": "CLOSE_WAIT", "0A": "LISTEN"}


CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def request_body(route: str, stream: bool, usage: bool | None, max_tokens: int) -> dict[str, Any]:
    """A greedy chat or completions request for the tiny model, streamed or not, with
    ``stream_options.include_usage`` set to ``usage`` (left out when None)."""
    body: dict[str, Any] = {"model": "tiny", "max_tokens": max_tokens, "temperature": 0}
    if route == CHAT:
        body["messages"] = [{"role": "user", "content": "def fibonacci(n):"}]
    else:
        body["prompt"] = "import os\nimport sys\n"
    if stream:
        body["stream"] = True
        if usage is not None:
            body["stream_options"] = {"include_usage": usage}
    return body


@contextlib.contextmanager
def refused_url() -> Iterator[str]:
    """A loopback URL that refuses connections for the block: its port is bound and never
    listened on, so no other process of a long suite can take it (a port that was merely
    free when a module was imported may be a server's by the time its test runs)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def samples(base_url: str) -> Samples:
    """The samples ``base_url``/metrics serves now."""
    return scrape(base_url)


def metric(base_url: str, name: str, **labels: str) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels`` (0 if none)."""
    return sample_sum(scrape(base_url), name, **labels)


def label_values(base_url: str, name: str, label: str) -> set[str]:
    """Every value ``label`` takes on the samples named ``name``."""
    return {lb[label] for lb, _ in scrape(base_url).get(name, []) if label in lb}


def sse_frames(body: bytes) -> list[bytes]:
    """Complete SSE frames of ``body`` (separator stripped); a trailing partial frame is kept."""
    parts = body.split(b"\n\n")
    if parts and parts[-1] == b"":
        parts.pop()
    return parts


def frame_json(frame: bytes) -> Any:
    """The JSON payload of a ``data: {...}`` frame; raises if it is not one."""
    if not frame.startswith(b"data: "):
        raise ValueError(f"not a data frame: {frame[:80]!r}")
    return orjson.loads(frame[6:])


def is_error_frame(frame: bytes) -> bool:
    """True for a well-formed OpenAI-style error frame ``data: {"error": {...}}``."""
    try:
        obj = frame_json(frame)
    except (ValueError, orjson.JSONDecodeError):
        return False
    return isinstance(obj, dict) and isinstance(obj.get("error"), dict)


def stream_error(body: bytes) -> dict[str, Any]:
    """The error a stream ended with: its frame before the closing ``[DONE]``."""
    frames = sse_frames(body)
    assert frames[-1:] == [DONE_FRAME.rstrip()], f"no [DONE] at the end: {body[-200:]!r}"
    assert len(frames) > 1 and is_error_frame(frames[-2]), f"no error frame: {body[-300:]!r}"
    error: dict[str, Any] = frame_json(frames[-2])["error"]
    return error


def open_fds(pid: int) -> int:
    """Number of open file descriptors of ``pid``."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def tcp_sockets(pid: int, remote_port: int | None = None) -> list[str]:
    """States of the TCP sockets ``pid`` holds open (to ``remote_port`` if given)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    states = []
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            cols = line.split()
            if cols[9] not in inodes:
                continue
            port = int(cols[2].rsplit(":", 1)[1], 16)
            if remote_port is None or port == remote_port:
                states.append(_TCP_STATES.get(cols[3], cols[3]))
    return states


class EventCounts:
    """An exporter's written/dropped counters, kept in memory (what the metrics would count)."""

    def __init__(self) -> None:
        self.written = 0
        self.dropped: dict[str, int] = {}

    def event_written(self, exporter: str, n: int) -> None:
        self.written += n

    def event_dropped(self, exporter: str, reason: str, n: int) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + n


def stall_bound_s(work: Callable[[], object]) -> float:
    """How slow a /health answer may be while the server does ``work`` off its event loop:
    half the time ``work`` takes here (a loop doing it would stall about that long), never
    under 0.5 s. Measured in the same run, so a loaded machine loosens both sides alike."""
    t0 = time.monotonic()
    work()
    return max(0.5, (time.monotonic() - t0) / 2)


class HealthProbe:
    """``with HealthProbe(url) as p:`` reads /health in a thread; ``p.slowest_s`` after."""

    def __init__(self, base_url: str) -> None:
        self.url = base_url + "/health"
        self.slowest_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        # A new connection each look, as a liveness probe makes; one client (a new client
        # loads a CA bundle, ~17 ms, which the slowest look would count as the sidecar's).
        fresh = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(timeout=10, limits=fresh) as client:
            while not self._stop.is_set():
                t0 = time.monotonic()
                client.get(self.url)
                self.slowest_s = max(self.slowest_s, time.monotonic() - t0)
                time.sleep(0.01)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def prometheus_at(directory: Path, target: str, binary: str) -> PrometheusProcess:
    """A real Prometheus scraping ``target`` (host:port) every second; files in ``directory``."""
    scrape = {"job_name": "vllm-obs-sidecar", "static_configs": [{"targets": [target]}]}
    config = {
        "global": {"scrape_interval": "1s"},
        "storage": EXEMPLAR_STORAGE,
        "scrape_configs": [scrape],
    }
    path = directory / "prometheus.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    data, log = directory / "prometheus", directory / "prometheus.log"
    return PrometheusProcess(binary, path, data, log, free_port()).start()


def wait_for(what: str, check: Callable[[], T], timeout_s: float = 60.0, every_s: float = 0.5) -> T:
    """``check()``'s first truthy result, polled every ``every_s``; fails after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every_s)
