"""`vllm-obs query incident`: the postmortem's first draft in words, from a window of events."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from obs.cli import main
from obs.conventions import CAUSE_WORDS
from obs.procs import free_port
from obs.query.testing import event, ts, write_jsonl

pytestmark = pytest.mark.inproc  # the query's progress thread; a Prometheus that is down

LANES = {
    "version": 1,
    "pools": [{"name": "p", "replicas": ["http://r1"]}],
    "lanes": [
        {"name": "chat", "pool": "p", "slo": {"ttft": {"threshold_ms": 300, "objective": 0.95}}},
        {"name": "batch", "pool": "p"},
    ],
    "default_lane": "chat",
}


def _log(tmp_path: Path) -> tuple[str, str]:
    """Ten minutes of chat: good requests throughout, and from minute 4 to 6 a saturated
    pool (engine wait inferred) behind most misses; the replica's settings change at minute
    5. Returns (log, config)."""
    events = []
    for i in range(120):
        t = i * 5.0
        pool = {"pool_in_flight": 0, "pool_max_running": 2, "settings_fingerprint": "aaaa"}
        if t >= 300:
            pool["settings_fingerprint"] = "bbbb"
        kw: dict[str, Any] = {"queue_ms": 2.0, "prefill_ms": 40.0, "decode_ms": 200.0}
        if 240 <= t < 360:
            pool |= {"pool_in_flight": 6, "pool_max_running": 2}
            kw = {"queue_ms": 900.0, "prefill_ms": 40.0, "decode_ms": 200.0}
            kw |= {"engine_view": "inferred", "engine_queue_ms": 898.0}
        events.append(
            event(ts=ts(t), lane="chat", pool="p", replica="http://r1", tenant="acme", **kw, **pool)
        )
    log = str(write_jsonl(tmp_path / "events.jsonl", events))
    config = tmp_path / "lanes.yaml"
    config.write_text(yaml.safe_dump(LANES), encoding="utf-8")
    return log, str(config)


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["query", "incident", *args, "--no-progress"]) == 0
    return capsys.readouterr().out


def test_incident_tells_which_lane_when_why_and_the_lever(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The draft names the lane and SLO that missed, from when to when, the budget burned, the
    phase and cause behind it with the runbook's lever, the tenant and replica, and the
    settings change inside the window."""
    log, config = _log(tmp_path)
    window = ["--since", "2025-06-02T12:00:00Z", "--until", "2025-06-02T12:10:00Z"]
    text = _run(capsys, log, "--config", config, *window)
    assert "Lane chat missed its ttft SLO on 24 of 120 requests, 400% of its budget" in text
    assert "from 12:04:00 to 12:05:55" in text  # the draft's day is said once, in its header
    assert "Behind 100% of it: phase queue, cause engine_queue" in text
    assert CAUSE_WORDS["engine_queue"][1] in text
    assert "replica http://r1 (100%), tenant acme (100%)" in text
    assert "replica http://r1 settings aaaa -> bbbb" in text
    assert "Alerts: not read (give --prometheus URL)." in text

    doc = json.loads(_run(capsys, log, "--config", config, *window, "--format", "json"))
    (s,) = doc["slos"]
    assert (s["lane"], s["slo"], s["phase"], s["cause"]) == (
        "chat",
        "ttft",
        "queue",
        "engine_queue",
    )
    assert s["most_from"] >= "2025-06-02T12:04:00" and s["most_until"] < "2025-06-02T12:06:00"


def test_incident_with_nothing_missed_and_prometheus_down(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A window with no miss says so; a Prometheus that does not answer is named in the
    draft, never a traceback."""
    log, config = _log(tmp_path)
    url = f"http://127.0.0.1:{free_port()}"
    window = ["--since", "2025-06-02T12:00:00Z", "--until", "2025-06-02T12:03:00Z"]
    text = _run(capsys, log, "--config", config, *window, "--prometheus", url)
    assert "No lane missed an SLO in the window." in text
    assert f"Alerts: not read from {url}" in text


def _burst(
    tmp_path: Path, slots: int = 8, in_flight: int = 2, stamp: str | None = None
) -> tuple[str, str]:
    """A minute of chat (good, 2 requests a second) and two small-lane batch requests; at
    second 30 a burst of 20 long batch prompts lands, and the chat requests in the next
    five seconds wait behind it (TTFT 900 ms); ``in_flight`` of ``slots`` batch slots taken
    at their dispatch; ``stamp``: the cause the sidecar stamped on those misses. Returns (log,
    config)."""
    events = []
    state = {"pool_max_running": slots, "pool_kv_usage": 0.2, "replica": "http://r1"}
    for i in range(120):
        t = i * 0.5
        hit = 30.0 <= t < 35.0
        kw = {"queue_ms": 900.0 if hit else 5.0, "prefill_ms": 40.0, "decode_ms": 100.0}
        events.append(
            event(ts=ts(t), lane="chat", pool="p", prompt_tokens=50,
                  pool_in_flight=in_flight if hit else 0, engine_view="joined",
                  miss_cause=stamp if hit else None,
                  engine_queue_ms=kw["queue_ms"], pool_ahead_prompt_tokens=20000 if hit else 0,
                  **kw, **state)
        )  # fmt: skip
    for _ in range(20):
        events.append(
            event(ts=ts(30.0), lane="batch", pool="p", prompt_tokens=1500, queue_ms=1.0,
                  prefill_ms=3000.0, decode_ms=2000.0, pool_in_flight=0, **state)
        )  # fmt: skip
    for t in (2.0, 50.0):
        events.append(event(ts=ts(t), lane="batch", pool="p", prompt_tokens=100, **state))
    log = str(write_jsonl(tmp_path / "events.jsonl", events))
    config = tmp_path / "lanes.yaml"
    config.write_text(yaml.safe_dump(LANES), encoding="utf-8")
    return log, str(config)


def test_incident_names_trigger_victim_share_mechanism_and_lever(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The burst's lane is the trigger with its figures, the lane that missed is the first
    victim with the share of its wait the burst was ahead, the mechanism tells token-budget-
    bound queueing (slots free) and says the KV cache was fine, and the lever moves the
    trigger's lane to its own pool, naming the config keys."""
    log, config = _burst(tmp_path)
    doc = json.loads(_run(capsys, log, "--config", config, "--format", "json"))
    (inc,) = doc["incidents"]
    assert inc["pool"] == "p"
    t = inc["trigger"]
    assert (t["lane"], t["requests"], t["prompt_tokens"]) == ("batch", 20, 30000)
    (v,) = inc["victims"]
    assert (v["lane"], v["missed"], v["requests"]) == ("chat", 10, 120)
    assert v["trigger_share"] >= 0.9 and not v["small"]
    assert inc["mechanism_kind"] == "token_budget_bound"
    assert "--max-num-batched-tokens" in inc["mechanism"] and "at most 3 of 8" in inc["mechanism"]
    assert any(f.startswith("KV cache (at most 20%") for f in inc["fine"])
    assert inc["lever"].startswith("move lane batch to its own pool (its `pool:`")
    assert "admission.max_prompt_tokens" in inc["lever"]
    text = _run(capsys, log, "--config", config)
    assert "Incident on pool p, from 12:00:30 to 12:00:35: lane batch sent 20 requests" in text
    assert "- Victim: lane chat missed 10 of 120 requests; batch's requests were ahead" in text
    assert all(len(line) <= 120 for line in text.splitlines())


def test_incident_tells_slot_bound_queueing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every batch slot taken at the misses' dispatch: slot-bound queueing, and the lever
    names --max-num-seqs beside the trigger's own pool."""
    log, config = _burst(tmp_path, slots=4, in_flight=4)
    doc = json.loads(_run(capsys, log, "--config", config, "--format", "json"))
    (inc,) = doc["incidents"]
    assert inc["mechanism_kind"] == "slot_bound" and "4 of 4 in flight" in inc["mechanism"]
    assert "--max-num-seqs" in inc["lever"] and "move lane batch" in inc["lever"]


def test_incident_names_one_slow_replica(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two replicas, one answering ten times slower over the same minute: the mechanism is
    that replica, the lever drains it; a lane with few requests is flagged small."""
    events = []
    for i in range(60):
        slow = i % 2 == 1
        events.append(
            event(ts=ts(i * 1.0), lane="chat", pool="p", prompt_tokens=50,
                  replica="http://r2" if slow else "http://r1", queue_ms=1.0,
                  prefill_ms=1200.0 if slow else 60.0, decode_ms=50.0, pool_in_flight=0,
                  pool_max_running=8)
        )  # fmt: skip
    for i in range(3):
        events.append(
            event(ts=ts(i * 2.0 + 1), lane="batch", pool="p", prompt_tokens=100,
                  replica="http://r2", prefill_ms=100.0)
        )  # fmt: skip
    log = str(write_jsonl(tmp_path / "events.jsonl", events))
    lanes = {**LANES, "pools": [{"name": "p", "replicas": ["http://r1", "http://r2"]}]}
    config = tmp_path / "lanes.yaml"
    config.write_text(yaml.safe_dump(lanes), encoding="utf-8")
    doc = json.loads(_run(capsys, log, "--config", str(config), "--format", "json"))
    (inc,) = doc["incidents"]
    assert inc["mechanism_kind"] == "slow_replica" and inc["slow_replica"] == "http://r2"
    assert "http://r2" in inc["mechanism"] and inc["lever"].startswith("drain replica http://r2")


def test_incident_names_the_cause_show_budget_and_the_alerts_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The misses' stamped cause (what `show` prints and the alerts' burn by cause counts) is
    the incident's cause and budget's, where the window's re-attribution alone would have
    said prefills_ahead; the mechanism's line names it as one answer."""
    log, config = _burst(tmp_path, slots=4, in_flight=4, stamp="engine_queue")
    doc = json.loads(_run(capsys, log, "--config", config, "--format", "json"))
    (inc,) = doc["incidents"]
    assert inc["cause"] == "engine_queue" and "budget_cause" not in inc
    assert "(cause engine_queue, as show, budget and the alerts say)" in inc["mechanism"]
    (s,) = doc["slos"]
    assert [(r["cause"], r["misses"]) for r in s["causes"]] == [("engine_queue", 10)]
    (tmp_path / "unstamped").mkdir()
    unstamped, _ = _burst(tmp_path / "unstamped", slots=4, in_flight=4)
    doc = json.loads(_run(capsys, unstamped, "--config", config, "--format", "json"))
    assert doc["incidents"][0]["cause"] == "prefills_ahead"


def test_words_tell_the_most_harmful_incidents_and_count_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seven separate incidents: the words tell the five that hurt most, in time order, and
    say how many more the JSON lists."""
    events = []
    for k in range(7):  # one chat miss every 5 minutes, k of them for incident k
        for j in range(k + 1):
            events.append(
                event(ts=ts(k * 300.0 + j), lane="chat", pool="p", replica="http://r1",
                      queue_ms=900.0, prefill_ms=40.0, pool_in_flight=0, pool_max_running=8)
            )  # fmt: skip
        events += [event(ts=ts(k * 300.0 + 100 + j), lane="chat", pool="p") for j in range(20)]
    log = str(write_jsonl(tmp_path / "events.jsonl", events))
    config = tmp_path / "lanes.yaml"
    config.write_text(yaml.safe_dump(LANES), encoding="utf-8")
    doc = json.loads(_run(capsys, log, "--config", str(config), "--format", "json"))
    assert len(doc["incidents"]) == 7
    text = _run(capsys, log, "--config", str(config))
    told = re.findall(r"Incident on pool p, (?:at|from) (\d\d:\d\d:\d\d)", text)
    assert told == ["12:10:00", "12:15:00", "12:20:00", "12:25:00", "12:30:00"]
    assert "2 more incidents with fewer misses: --format json lists every one." in text
