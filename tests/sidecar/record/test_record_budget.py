"""Floods of client-caused events: one budget bounds what is written, the record's counts stay
exact (issue 32 item 4, issue 25 item 3).

A real sidecar process. Its pool is ``HoldingPool`` below, a socket that accepts a request
and never answers, because the test needs the lane's one slot held for the whole flood and no
real vLLM holds a request that long on demand; every other request is refused before any pool.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from obs import conventions as c
from obs.procs import free_port
from obs.query import api
from obs.sidecar.testing import SidecarProcess
from tests.conftest import SidecarFactory
from tests.support.probes import metric

FLOOD = 2_000  # refusals: 100 times the budget per second, far past it
BUDGET = 20  # --client-events-per-s
FLOOD_S = 5  # the connect-and-close flood: thousands of connections, far past the budget


class HoldingPool:
    """Accepts connections and reads; never answers (holds the lane's slot)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        # Stop accepting first (shutdown wakes the blocked accept), so no connection is
        # accepted after the loop below and left for the collector unclosed.
        self.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join()
        self.sock.close()
        for conn in self.conns:
            conn.close()


@pytest.fixture
def holding_pool() -> Iterator[HoldingPool]:
    pool = HoldingPool()
    yield pool
    pool.close()


def _one_slot_config(tmp_path: Path, pool_url: str) -> Path:
    data = {
        "pools": [{"name": "p", "replicas": [pool_url]}],
        "lanes": [
            {
                "name": "one",
                "pool": "p",
                "admission": {"max_concurrency": 1, "max_queue": 0},
                "timeouts": {"first_token_s": 600},
            }
        ],
        "default_lane": "one",
    }
    path = tmp_path / "one-slot.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _counted(events: list[dict[str, Any]], status: str) -> int:
    """Requests of ``status`` in the record: one per event, ``summarized`` per summary."""
    return sum(e.get("summarized") or 1 for e in events if e["status"] == status)


def _settled(sc: SidecarProcess, status: str, want: float) -> list[dict[str, Any]]:
    """The events once the record counts ``want`` requests of ``status`` (summaries are
    written each second), or after 10 s."""
    deadline = time.monotonic() + 10
    while True:
        events = sc.events()
        if _counted(events, status) >= want or time.monotonic() > deadline:
            return events
        time.sleep(0.2)


def test_a_flood_of_refusals_is_counted_exactly_in_the_record(
    sidecar: SidecarFactory, holding_pool: HoldingPool, tmp_path: Path
) -> None:
    """2,000 refusals: the record (events and summaries, and `query summary`) counts as many
    as vllm_obs_admission_rejections_total, with at most the budget written one by one."""
    sc = sidecar(
        config=_one_slot_config(tmp_path, holding_pool.url),
        args=("--client-events-per-s", str(BUDGET)),
        traces=False,
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    holder = threading.Thread(
        target=lambda: httpx.post(sc.url + "/v1/chat/completions", json=body, timeout=30),
        daemon=True,
    )
    holder.start()
    deadline = time.monotonic() + 10
    while metric(sc.url, "vllm_obs_in_flight_requests", lane="one") < 1:
        assert time.monotonic() < deadline, "the first request never held the slot"
        time.sleep(0.05)

    def flood(n: int) -> list[int]:
        with httpx.Client(base_url=sc.url, timeout=30) as client:
            return [client.post("/v1/chat/completions", json=body).status_code for _ in range(n)]

    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as ex:
        codes = [s for part in ex.map(flood, [FLOOD // 4] * 4) for s in part]
    elapsed = time.monotonic() - t0
    assert codes.count(429) == FLOOD

    counter = metric(sc.url, "vllm_obs_admission_rejections_total", lane="one")
    assert counter == FLOOD
    events = _settled(sc, c.REJECTED, counter)
    assert _counted(events, c.REJECTED) == counter
    one_by_one = [e for e in events if e["status"] == c.REJECTED and not e.get("summarized")]
    assert len(one_by_one) <= BUDGET * (elapsed + 2) + 1
    assert sc.events_path is not None
    table = api.summary(sc.events_path, config=_one_slot_config(tmp_path, holding_pool.url))
    row = table.set_index("lane").loc["one"]
    # The held request has no event yet: every request in the record is a refusal.
    assert row["requests"] == FLOOD
    assert round(row["rejection_rate"] * row["requests"]) == FLOOD


def _connect_and_close(port: int, until: float) -> int:
    """Open, send a request's headers promising a body, close; until ``until``. The count."""
    n = 0
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: 100\r\n\r\n{"
    )
    while time.monotonic() < until:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(head)
        n += 1
    return n


@pytest.mark.process
def test_connect_and_close_for_seconds_stays_within_the_event_budget(
    sidecar: SidecarFactory,
) -> None:
    """5 s of connect-and-close: the events file grows by at most the budget (plus one summary
    a second), and the record counts as many client_disconnect as the sidecar's counter."""
    sc = sidecar(
        f"http://127.0.0.1:{free_port()}",
        args=("--client-events-per-s", str(BUDGET)),
        traces=False,
    )
    t0 = time.monotonic()
    with ThreadPoolExecutor(2) as ex:
        sent = sum(ex.map(lambda _: _connect_and_close(sc.port, t0 + FLOOD_S), range(2)))
    # The last closes may still be in the sidecar when the flood ends: read the counter and
    # the record until they agree (the record is written a second behind), or 10 s pass.
    deadline = time.monotonic() + 10
    while True:
        counter = metric(sc.url, "vllm_obs_requests_total", outcome=c.DISCONNECTED)
        events = _settled(sc, c.DISCONNECTED, counter)
        if _counted(events, c.DISCONNECTED) == counter or time.monotonic() > deadline:
            break
    # The sidecar took the flood's last connections up to now: the budget bounds this span.
    elapsed = time.monotonic() - t0
    assert counter > FLOOD_S * BUDGET  # the flood went past the budget
    assert counter <= sent
    assert _counted(events, c.DISCONNECTED) == counter
    one_by_one = [e for e in events if not e.get("summarized")]
    summaries = [e for e in events if e.get("summarized")]
    assert len(one_by_one) <= BUDGET * (elapsed + 1) + 1
    assert len(summaries) <= elapsed + 3  # one outcome: one summary a second at most
    assert all(e["request_id"].startswith("summary-") for e in summaries)
