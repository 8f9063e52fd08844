"""What the ``query canary`` suites share (tests/query/test_query_canary.py and
tests/clickhouse/test_clickhouse_canary.py): a split lane's config and each arm's events."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import yaml

from obs.events import Event
from obs.query.testing import event, ts

# The lane's canary block by default; a test passes its own to write_config.
CANARY: dict[str, Any] = {"min_requests": 100}


def write_config(tmp_path: Path, canary: dict[str, Any] | None = None) -> Path:
    """A config whose lane ``chat`` splits 95/5 between pools ``stable`` and ``canary``."""
    lane = {
        "name": "chat",
        "split": {"stable": 95, "canary": 5},
        "canary": CANARY if canary is None else canary,
        "slo": {"ttft": {"threshold_ms": 500}, "availability": {"objective": 0.99}},
    }
    data = {
        "pools": [
            {"name": "stable", "replicas": ["http://127.0.0.1:1"]},
            {"name": "canary", "replicas": ["http://127.0.0.1:2"]},
        ],
        "lanes": [lane],
        "default_lane": "chat",
    }
    path = tmp_path / "lanes.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def arm_events(
    arm: str, n: int, slower: float, errors: int = 0, seed: int = 1, start_s: float = 0.0
) -> list[Event]:
    """``n`` events of one arm, one a second from ``start_s``; TTFT and TPOT ``slower``
    times the baseline's distribution (~150 ms median TTFT); the first ``errors`` fail."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ttft = rng.lognormvariate(5.0, 0.3) * slower
        fields: dict[str, Any] = {
            "lane": "chat",
            "pool": arm,
            "arm": arm,
            "ts": ts(start_s + i),
            "request_id": f"{arm}-{seed}-{i:05d}",
        }
        if i < errors:
            fields |= {"status": "error", "error_class": "upstream_status", "stream": True}
            out.append(event(**fields))
            continue
        fields |= {"prefill_ms": ttft, "ttft_ms": ttft, "tpot_ms": rng.uniform(20, 30) * slower}
        out.append(event(**fields, completion_tokens=50))
    return out
