"""The stress replay's small version (bench/stress.py): six profiles x 2,000 requests of the
six-class mix through the sidecar's classifier, admission and routing onto simulated pools."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import orjson
import pytest

from bench import stress
from obs.sweep.profile import SHIPPED, resolve

REQUESTS = 2000


@pytest.mark.slow
def test_small_stress_accounts_for_every_request_and_names_the_best_profile(
    tmp_path: Path,
) -> None:
    """Every planned request of every profile becomes exactly one event (none lost), the
    matrix has each profile's whole-system row over those requests and a best profile,
    each event's lane and pool are the profile's own, and each streamed answer of more
    than one token carries its inter-token gaps."""
    out = tmp_path / "stress.json"
    args = ["--profile", "all", "--requests", str(REQUESTS), "--events", str(tmp_path)]
    assert stress.main([*args, "--matrix", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["accounted"] is True and doc["simulated"] is True
    assert [r["profile"] for r in doc["runs"]] == list(SHIPPED)
    assert all(r["events"] == r["sent"] == REQUESTS for r in doc["runs"])
    assert [r["profile"] for r in doc["system"]] == list(SHIPPED)
    assert all(r["offered"] == REQUESTS for r in doc["system"])
    assert doc["best_overall"]["best"] in SHIPPED
    for name in SHIPPED:
        config = resolve(name).config
        with gzip.open(tmp_path / f"{name}.jsonl.gz") as f:
            events = [orjson.loads(line) for line in f]
        assert len(events) == REQUESTS
        assert len({e["request_id"] for e in events}) == REQUESTS
        for e in events:
            assert config.lane(e["lane"]).pool == e["pool"]
            assert e["status"] in ("ok", "rejected", "error")
            if e["status"] == "ok" and e["stream"] and e["completion_tokens"] > 1:
                assert 0 < e["itl_p50_ms"] <= e["itl_p95_ms"] <= e["itl_max_ms"]
