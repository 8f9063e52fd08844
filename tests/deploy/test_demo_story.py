"""``vllm-obs demo``'s story (obs.demo.story): the load sized from the probed capacity, the
closing summary, and a whole run on simulated pools, clients naming no class."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from obs.demo import story
from obs.demo.workload import load_demo_mix, write_mix
from tests.deploy.test_demo import DEMO_TIMEOUT_S, _assert_nothing_survives, _demo
from tests.support import QUICK_DRAIN


def test_rate_is_a_share_of_the_probed_capacity_in_sessions(tmp_path: Path) -> None:
    """The load's rate is LOAD_SHARE of the requests/s the probe completed, divided by how
    many probe-sized requests one session of the mix asks for (never below 0.1/s)."""
    cap = story.Capacity(requests_per_s=10.0, tokens_per_request=64.0, streams=16)
    assert cap.rate(0.5, 128.0) == 2.5
    assert cap.rate(0.5, 32.0) == 5.0  # a session smaller than a probe request counts as one
    assert story.Capacity(0.05, 64.0, 16).rate(0.5, 640.0) == 0.1
    mix = load_demo_mix(write_mix(tmp_path / "mix.yaml", False), ())
    assert 64 < story.tokens_per_session(mix) < 400


def test_closing_summary_names_the_incident_the_lane_and_the_coverage() -> None:
    """The closing lines say when the burst hit, which lane missed (not the burst's own),
    its top phase/cause and lever, and the share of completed requests with the engine's
    view and of misses left `other`."""
    burst = story.Burst("http://x", "tiny", 1.0)
    burst.started_at = datetime(2026, 1, 1, 12, 0, 5, tzinfo=UTC)
    slo = {
        "budget_spent": 2.0, "judged": 40, "misses": 8, "most_from": "2026-01-01T12:00:06",
        "most_until": "2026-01-01T12:00:20", "cause_share": 0.75, "phase": "prefill",
        "cause": "prefills_ahead", "means": "waited behind long prompts", "lever": "split",
    }  # fmt: skip
    doc = {"slos": [{**slo, "lane": "rag", "slo": "ttft"}, {**slo, "lane": "chat", "slo": "ttft"}]}
    events: list[dict[str, Any]] = [
        {"status": "ok", "engine_view": "joined", "miss_cause": "prefills_ahead"},
        {"status": "ok", "engine_view": "joined", "miss_cause": None},
        {"status": "ok", "engine_view": "absent", "miss_cause": "other"},
        {"status": "error", "engine_view": "absent", "miss_cause": "upstream_error"},
    ]
    text = story.closing(doc, events, burst)
    assert text.splitlines()[0].startswith("At 2026-01-01T12:00:05+00:00 a burst of 24")
    assert "Lane chat missed its ttft SLO on 8 of 40 requests (200% of its budget)" in text
    assert "75% prefill/prefills_ahead" in text and "lever: split." in text
    assert "Engine view on 67% of 3 completed requests; 33% of 3 misses" in text


@pytest.mark.slow
def test_sim_demo_tells_the_story(tmp_path: Path) -> None:
    """`demo --engine sim`: the simulated pools send their spans, the load is sized from the
    probe, clients name no class, the incident's burst hits, and the closing summary says what
    happened; at least 95% of completed requests carry the engine's view and at most 10% of
    the misses are `other` (#40's bar for the demo)."""
    out = tmp_path / "out"
    proc = subprocess.run(
        _demo(
            "--engine",
            "sim",
            "--duration",
            "20",
            "--no-prometheus",
            *QUICK_DRAIN,
            "--out",
            str(out),
        ),
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
        check=False,
    )
    print(proc.stderr[-3000:], proc.stdout[-3000:])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "[probe] capacity" in proc.stderr and "incident: 24 long RAG prompts" in proc.stderr
    assert "What happened" in proc.stdout and "a burst of 24 long RAG prompts" in proc.stdout
    assert (out / "incident.txt").read_text().startswith("Incident draft")
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert not [e for e in events if e["class_source"] == "header"]
    done = [e for e in events if e["status"] == "ok"]
    viewed = [e for e in done if e["engine_view"] == "joined"]
    assert len(viewed) >= 0.95 * len(done), (len(viewed), len(done))
    misses = [e for e in events if e["miss_cause"]]
    other = [e for e in misses if e["miss_cause"] == "other"]
    assert misses and len(other) <= 0.10 * len(misses), [e["miss_cause"] for e in misses]
    _assert_nothing_survives(out)
