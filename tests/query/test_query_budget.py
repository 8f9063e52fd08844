"""`vllm-obs query budget`: the error budget per lane and SLO, split by phase and cause."""

from __future__ import annotations

import json
import random
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from obs.attribution import Baseline, Facts, attribute, is_good, missed
from obs.cli import main
from obs.config import default_config_path, load_config
from obs.conventions import PHASES, SLO_KINDS
from obs.events import Event
from obs.query.api import open_scan
from obs.query.error_budget import budget
from obs.query.scan import SRC
from obs.query.slo import judged_rows
from obs.query.testing import event, ts, write_jsonl

pytestmark = pytest.mark.inproc

CONFIG = load_config(default_config_path())
SLO_LANES = [lane for lane in CONFIG.lanes if lane.slo.ttft is not None]


def _mixed(seed: int, n: int = 400) -> list[Event]:
    """Varied events over one hour: queueing, slow prefill, failures, slow clients."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        lane = rnd.choice(SLO_LANES).name
        status = rnd.choice(("ok",) * 8 + ("error", "rejected"))
        kw: dict[str, Any] = {
            "request_id": f"b{seed}-{i:04d}",
            "ts": ts(rnd.uniform(0, 3600)),
            "lane": lane,
            "status": status,
            "stream": rnd.random() < 0.8,
            "queue_ms": round(rnd.choice((1.0, 1.0, 1.0, rnd.uniform(100, 9000))), 3),
            "prefill_ms": round(rnd.lognormvariate(5, 1.2), 3),
            "first_token_ms": round(rnd.uniform(0, 3), 3),
            "decode_ms": round(rnd.lognormvariate(6, 1), 3),
            "prompt_tokens": rnd.randint(10, 5000),
            "cache_hit": rnd.choice((True, True, False, None)),
            "stream_blocked_ms": round(rnd.choice((0.0, rnd.uniform(0, 5000))), 3),
            "replica": rnd.choice(("http://r1", "http://r2")),
            "tenant": rnd.choice(("acme", "globex", None)),
        }
        if status == "error":
            kw |= {
                "error_class": rnd.choice(("upstream_connect", "upstream_timeout", "internal")),
                "error_phase": rnd.choice(PHASES),
            }
        if kw["stream"] and status == "ok":
            kw["tpot_ms"] = round(rnd.uniform(5, 150), 3)
        out.append(event(**kw))
    return out


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Event]]:
    events = _mixed(7)
    return write_jsonl(tmp_path_factory.mktemp("budget") / "events.jsonl", events), events


def _expected(events: list[Event]) -> dict[tuple[str, str], Counter[tuple[str, str]]]:
    """The attribution done directly, with each lane's exact mean over its good requests."""
    facts = [Facts.of(e) for e in events]
    out: dict[tuple[str, str], Counter[tuple[str, str]]] = {}
    for lane in SLO_LANES:
        mine = [f for f in facts if f.lane == lane.name]
        good = [f for f in mine if is_good(f, lane)]

        def mean(vals: list[Any]) -> float | None:
            vals = [v for v in vals if v is not None]
            return statistics.fmean(vals) if vals else None

        base = Baseline(
            tuple(mean([f.phases_ms[i] for f in good]) or 0.0 for i in range(len(PHASES))),
            mean([f.prompt_tokens for f in good]),
            mean([None if f.cache_hit is None else float(f.cache_hit) for f in good]),
            mean([f.engine_queue_ms for f in good]),
        )
        for kind in SLO_KINDS:
            out[(lane.name, kind)] = Counter()
        for f in mine:
            for m in attribute(f, lane, base):
                out[(lane.name, m.slo)][(m.phase, m.cause)] += 1
    return out


def test_budget_matches_direct_attribution(log: tuple[Path, list[Event]]) -> None:
    """Misses per lane, SLO, phase and cause of events the sidecar did not stamp are the rule
    applied with the window's baseline."""
    path, events = log
    doc = budget(open_scan(path), CONFIG, [str(path)])
    want = _expected(events)
    seen = 0
    for e in doc["slos"]:
        got = Counter({(r["phase"], r["cause"]): r["misses"] for r in e["by_phase_cause"]})
        assert got == want[(e["lane"], e["slo"])], (e["lane"], e["slo"])
        assert e["misses"] == sum(got.values())
        if e["allowed"]:
            assert e["budget_spent"] == pytest.approx(e["misses"] / e["allowed"])
        seen += e["misses"]
    assert seen > 20
    causes = {r["cause"] for e in doc["slos"] for r in e["by_cause"]}
    assert {"admission_queue", "upstream_error"} <= causes


def test_judged_counts_follow_the_alert_rules(log: tuple[Path, list[Event]]) -> None:
    """Availability is judged on every request but refused ones; TTFT on those with a value."""
    path, events = log
    doc = budget(open_scan(path), CONFIG, [str(path)])
    for e in doc["slos"]:
        mine = [ev for ev in events if ev.lane == e["lane"]]
        if e["slo"] == "availability":
            assert e["judged"] == sum(
                ev.status not in ("rejected", "client_disconnect") for ev in mine
            )
        elif e["slo"] == "ttft":
            assert e["judged"] == sum(Facts.of(ev).ttft_value is not None for ev in mine)


def test_window_ends_with_the_newest_event(log: tuple[Path, list[Event]], capsys) -> None:
    """--window 10m counts only the misses of the last ten minutes of the log."""
    path, events = log
    assert (
        main(["query", "budget", str(path), "--window", "10m", "--format", "json", "--no-progress"])
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    newest = max(ev.ts for ev in events)
    recent = [ev for ev in events if ev.ts > ts(3600 - 600 - 60)]
    assert doc["until"][:16] == newest[:16]
    total = sum(e["misses"] for e in doc["slos"])
    everything = budget(open_scan(path), CONFIG, [str(path)])
    assert 0 < total < sum(e["misses"] for e in everything["slos"])
    assert total <= sum(bool(missed(Facts.of(ev), CONFIG.lane(ev.lane))) * 3 for ev in recent)


def test_worst_misses_carry_a_working_show_command(log: tuple[Path, list[Event]], capsys) -> None:
    """Each worst miss names the `query show` command, and that command finds the request."""
    path, _ = log
    assert (
        main(["query", "budget", str(path), "--lane", "chat", "--format", "json", "--no-progress"])
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert {e["lane"] for e in doc["slos"]} == {"chat"}
    worst = [w for e in doc["slos"] for w in e["worst"]]
    assert worst
    argv = worst[0]["show"].split()
    assert argv[:3] == ["vllm-obs", "query", "show"]
    assert main([*argv[1:], "--format", "json", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["event"]["request_id"] == worst[0]["request_id"]


def test_python_api_gives_the_json_document(log: tuple[Path, list[Event]], capsys) -> None:
    """obs.query.budget returns what `query budget --format json` prints."""
    import obs.query as q

    path, _ = log
    assert (
        main(["query", "budget", str(path), "--window", "30m", "--format", "json", "--no-progress"])
        == 0
    )
    assert q.budget(str(path), window="30m") == json.loads(capsys.readouterr().out)


def test_table_output_names_top_phase_and_cause(log: tuple[Path, list[Event]], capsys) -> None:
    """The table output has the four sections and a top phase and cause per lane and SLO."""
    path, _ = log
    assert main(["query", "budget", str(path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    for title in ("Error budget spent", "by phase and cause", "top replicas", "Worst misses"):
        assert title in out
    assert "admission_queue" in out and "vllm-obs query show" in out


def test_bad_window_is_one_clear_error(log: tuple[Path, list[Event]], capsys) -> None:
    """A window that is not a duration is refused with a message naming it."""
    path, _ = log
    assert main(["query", "budget", str(path), "--window", "soon", "--no-progress"]) != 0
    assert "--window soon" in capsys.readouterr().err


def test_report_has_a_budget_section(log: tuple[Path, list[Event]], tmp_path: Path) -> None:
    """The HTML report carries the budget tables."""
    path, _ = log
    assert main(["query", "report", str(path), "--out", str(tmp_path), "--no-progress"]) == 0
    text = (tmp_path / "report.html").read_text()
    assert "Where the error budget went" in text and "admission_queue" in text


event_st = st.builds(
    lambda lane, status, stream, ttft, tpot, e2e: event(
        lane=lane, status=status, stream=stream, ttft_ms=ttft, tpot_ms=tpot, e2e_ms=e2e
    ),
    st.sampled_from([*CONFIG.lane_names, "nowhere"]),
    st.sampled_from(("ok", "error", "rejected", "client_error", "client_disconnect")),
    st.booleans(),
    st.none() | st.floats(0, 20_000, allow_nan=False).map(lambda v: round(v, 3)),
    st.none() | st.floats(0, 500, allow_nan=False).map(lambda v: round(v, 3)),
    st.floats(0, 20_000, allow_nan=False).map(lambda v: round(v, 3)),
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(event_st, min_size=1, max_size=30))
def test_sql_and_python_judge_the_same_misses(tmp_path: Path, events: list[Event]) -> None:
    """The SQL gates (obs.query.slo) and the Python ones (obs.attribution) agree on every event."""
    path = write_jsonl(tmp_path / "judge.jsonl", events)
    rows = open_scan(path).run(
        "SELECT request_id, _ttft_judged AND NOT _ttft_met AS t, _tpot_judged AND NOT _tpot_met "
        f"AS p, _good AS g FROM {judged_rows(CONFIG, SRC)} WHERE request_id IS NOT NULL"
    )
    by_id = {r[0]: r[1:] for r in rows.rows}
    for ev in events:
        lane = CONFIG.lane(ev.lane) if ev.lane in CONFIG.lane_names else None
        f = Facts.of(ev)
        gates = missed(f, lane)
        t, p, g = by_id[ev.request_id]
        assert ("ttft" in gates, "tpot" in gates) == (bool(t), bool(p))
        assert is_good(f, lane) == bool(g)


def test_slow_uploads_are_the_clients_time_apart_from_the_budget(tmp_path: Path) -> None:
    """Requests whose bodies took 1.5 s to arrive (upload_ms) but were served at once spend
    none of the TTFT budget and show apart, as the client cause slow_upload."""
    lane = SLO_LANES[0]
    threshold = lane.slo.ttft.threshold_ms  # type: ignore[union-attr]
    events = [
        event(
            request_id=f"u{i:03d}",
            ts=ts(i),
            lane=lane.name,
            stream=True,
            queue_ms=0.4,
            prefill_ms=8.0,
            first_token_ms=0.1,
            decode_ms=20.0,
            tpot_ms=1.0,
            upload_ms=1500.0 if i < 40 else 3.0,
        )
        for i in range(60)
    ]
    path = write_jsonl(tmp_path / "events.jsonl", events)
    doc = budget(open_scan(path), CONFIG, [str(path)])
    (ttft,) = [e for e in doc["slos"] if (e["lane"], e["slo"]) == (lane.name, "ttft")]
    assert ttft["misses"] == 0 and ttft["budget_spent"] == 0
    assert threshold < 1500
    assert ttft["not_charged"] == [{"cause": "slow_upload", "requests": 40}]


def test_budget_names_a_slow_engine_against_the_windows_pace(tmp_path: Path) -> None:
    """With engine spans joined: a request whose engine prefilled its usual-size prompt 8x
    slower per token than the lane's good requests is engine_slow; one 10x longer at the usual
    pace is long_prefill (the window's baseline, as the sidecar's running one)."""
    lane = CONFIG.lane("chat")
    joined = {"lane": "chat", "engine_view": "joined", "first_token_ms": 1.0, "tpot_ms": 5.0}
    good = [
        event(request_id=f"g{i:03d}", ts=ts(i), prompt_tokens=50, prefill_ms=100.0,
              engine_prefill_ms=80.0, **joined)
        for i in range(40)
    ]  # fmt: skip
    slow = event(request_id="slow", ts=ts(41), prompt_tokens=50, prefill_ms=900.0,
                 engine_prefill_ms=700.0, **joined)  # fmt: skip
    long = event(request_id="long", ts=ts(42), prompt_tokens=500, prefill_ms=900.0,
                 engine_prefill_ms=800.0, **joined)  # fmt: skip
    path = write_jsonl(tmp_path / "events.jsonl", [*good, slow, long])
    doc = budget(open_scan(path), CONFIG, [str(path)])
    (ttft,) = [e for e in doc["slos"] if (e["lane"], e["slo"]) == (lane.name, "ttft")]
    got = {(r["phase"], r["cause"]): r["misses"] for r in ttft["by_phase_cause"]}
    assert got == {("prefill", "engine_slow"): 1, ("prefill", "long_prefill"): 1}
