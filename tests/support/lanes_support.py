"""What the lane suites share (tests/sidecar/test_lanes_*.py):
lanes configs over real engines, requests that hold a lane slot, and readers of the
sidecar's gauges, rejections and events."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import yaml

from obs import conventions as c
from obs.sidecar.testing import SidecarProcess
from tests.support import chat_body, probes
from tests.support.small_window import SmallWindow

CHAT = "/v1/chat/completions"


def lanes_config(tmp_path: Path, pools: dict[str, list[str]], lanes: list[dict[str, Any]]) -> Path:
    data = {
        "version": 1,
        "pools": [{"name": n, "replicas": r} for n, r in pools.items()],
        "lanes": lanes,
        "default_lane": lanes[-1]["name"],
    }
    path = tmp_path / "lanes.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def lane_spec(name: str, pool: str = "p", **admission: Any) -> dict[str, Any]:
    return {
        "name": name,
        "pool": pool,
        "match": [{"header": {"x-lane": name}}],
        "admission": HOLD | admission,
        # A starved 2-core machine can take seconds to connect or to answer: these tests
        # are about admission, not about the pool's deadlines.
        "timeouts": {"connect_s": 30, "first_token_s": 120, "idle_s": 120},
    }


LONG = {"ignore_eos": True}  # with max_tokens 1900: seconds of generation


# A scrape's wait: the 10 s default ran out once while a holder's vLLM stream and a full
# suite shared 2 cores. These suites poll /metrics every 50 ms, and the sidecar rests its
# render 4 times the last one's time (``Kept(rest=4.0)``, a scrape flood's guard), so one
# render slowed by a starved machine holds the next one back: what they read is the gauge,
# not how fast it answers.
SCRAPE_TIMEOUT_S = 30.0


def _scrape(sc: SidecarProcess) -> probes.Samples:
    return probes.scrape(sc.url, timeout_s=SCRAPE_TIMEOUT_S)


def lane_gauge(sc: SidecarProcess, name: str, lane: str) -> float:
    return probes.sample_sum(_scrape(sc), name, **{c.LANE: lane})


def rejections(sc: SidecarProcess) -> Counter[tuple[str, str]]:
    out: Counter[tuple[str, str]] = Counter()
    for lb, v in _scrape(sc).get(c.ADMISSION_REJECTIONS.name + "_total", []):
        if v:  # every lane x reason series exists from the start, at 0
            out[(lb[c.LANE], lb[c.REASON])] += int(v)
    return out


def post_lane(
    sc: SidecarProcess, lane: str, body: dict[str, Any], **headers: str
) -> httpx.Response:
    h = {"x-lane": lane, **headers}
    return httpx.post(sc.url + CHAT, json=body, headers=h, timeout=120)


class Holder:
    """A streamed request that keeps its lane slot: its client reads nothing.

    Lanes under test use the ``wait`` slow-client policy with a 4 KiB bound and the
    client a 4 KiB receive buffer, so the relay stops reading the pool once those fill:
    the request stays in flight, whatever vLLM's pace, until the client lets go. Its window is
    small from its first packet (tests/support/small_window.py).
    """

    def __init__(self, sc: SidecarProcess, lane: str, headers: dict[str, str]) -> None:
        body = chat_body(f"hold {uuid.uuid4().hex}", 1900, stream=True, **LONG)
        self.conn = SmallWindow(sc.url, timeout_s=60)
        self.response = self.conn.post_json(CHAT, body, {"x-lane": lane, **headers})
        assert self.response.status == 200, self.response.read()

    def release(self) -> None:
        self.conn.close()


HOLD = {"slow_client": {"buffer_bytes": 4096, "policy": "wait"}}


@contextmanager
def holding(sc: SidecarProcess, lane: str, n: int, **headers: str) -> Iterator[list[Holder]]:
    """``n`` requests holding slots of ``lane`` (seen on its in-flight gauge) while inside.

    Starts from an idle lane; if the slots are not all seen taken (a holder can lose its
    slot on a starved machine), the holders let go and fresh ones try again.
    """
    for _attempt in range(3):
        wait_gauge(sc, c.IN_FLIGHT.name, lane, lambda v: v == 0)
        holders: list[Holder] = []
        try:  # whatever fails (a scrape included), the holders let go: a holder left open
            # keeps its stream in flight, so the sidecar's stop waits out its shutdown grace
            # (30 s), and its socket, closed only when collected, fails a later test
            holders.extend(Holder(sc, lane, headers) for _ in range(n))
            deadline = time.monotonic() + 30
            while lane_gauge(sc, c.IN_FLIGHT.name, lane) < n and time.monotonic() < deadline:
                time.sleep(0.05)
            if lane_gauge(sc, c.IN_FLIGHT.name, lane) >= n:
                yield holders
                return
        finally:
            for h in holders:
                h.release()
    raise AssertionError(f"{n} holding requests were never all admitted to lane {lane}")


def wait_gauge(sc: SidecarProcess, name: str, lane: str, ok: Callable[[float], bool]) -> None:
    deadline = time.monotonic() + 60
    while not ok(lane_gauge(sc, name, lane)):
        assert time.monotonic() < deadline, f"{name}{{lane={lane}}} never settled"
        time.sleep(0.05)


def wait_queued(sc: SidecarProcess, lane: str, n: int) -> None:
    deadline = time.monotonic() + 30
    while lane_gauge(sc, c.QUEUED.name, lane) < n:
        assert time.monotonic() < deadline, f"never {n} queued in lane {lane}"
        time.sleep(0.05)


def assert_rejected(r: httpx.Response, status: int, reason: str) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["message"]
    if status == 429:
        assert int(r.headers["retry-after"]) >= 1
    assert reason  # the event carries it; checked by the caller


def query_budget(events: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """`vllm-obs query budget --format json` over ``events`` with the ``lanes.yaml`` beside
    it (as ``lanes_config`` writes it): each (lane, slo) entry."""
    out = subprocess.run(
        [sys.executable, "-m", "obs.cli", "query", "budget", str(events), "--config",
         str(events.parent / "lanes.yaml"), "--format", "json", "--no-progress"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return {(e["lane"], e["slo"]): e for e in json.loads(out.stdout)["slos"]}
