"""``query summary`` numbers agree with a direct computation over the same events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from obs.config import default_config_path, load_config
from obs.events import Event
from obs.query.aggregate import summary
from obs.query.filters import Filters
from obs.query.scan import Scan
from obs.query.testing import T0, write_jsonl
from tests.support import pct

pytestmark = pytest.mark.inproc

CONFIG = load_config(default_config_path())
PHASES = ("queue", "prefill", "first_token", "decode", "stream")


def ttft_value(e: Event) -> float | None:
    """The documented TTFT rule: ttft_ms, else e2e_ms for a successful non-streamed request."""
    if e.ttft_ms is not None:
        return e.ttft_ms
    if not e.stream and e.status == "ok":
        return e.e2e_ms
    return None


def expected_lane(events: list[Event], lane: str) -> dict[str, Any]:
    """Everything summary reports for one lane, computed in plain Python."""
    ev = [e for e in events if e.lane == lane]
    n = len(ev)
    ok = [e for e in ev if e.status == "ok"]
    slo = CONFIG.lane(lane).slo if lane in CONFIG.lane_names else None
    out: dict[str, Any] = {
        "requests": n,
        "ok": len(ok),
        "error_rate": sum(e.status == "error" for e in ev) / n,
        "rejection_rate": sum(e.status == "rejected" for e in ev) / n,
        "client_error_rate": sum(e.status == "client_error" for e in ev) / n,
        "disconnect_rate": sum(e.status == "client_disconnect" for e in ev) / n,
        "availability": 1 - sum(e.status == "error" for e in ev) / n,
    }
    hits = [e.cache_hit for e in ev if e.cache_hit is not None]
    out["cache_hit_ratio"] = sum(hits) / len(hits) if hits else None
    with_cached = [e for e in ev if e.cached_tokens is not None]
    prompt = sum(e.prompt_tokens or 0 for e in with_cached)
    out["cached_token_ratio"] = (
        sum(e.cached_tokens or 0 for e in with_cached) / prompt if prompt else None
    )
    columns = {f"{p}_ms": p for p in PHASES} | {
        "e2e_ms": "e2e",
        "ttft_ms": "ttft",
        "tpot_ms": "tpot",
        "itl_p50_ms": "itl",
    }
    for col, name in columns.items():
        values = [getattr(e, col) for e in ok if getattr(e, col) is not None]
        for q, label in ((0.5, "p50"), (0.9, "p90"), (0.95, "p95"), (0.99, "p99")):
            out[f"{name}_{label}_ms"] = pct(values, q)
    for p in (*PHASES, "e2e"):
        values = [getattr(e, f"{p}_ms") for e in ok]
        out[f"{p}_mean_ms"] = sum(values) / len(values) if values else None

    def judged(e: Event, kind: str) -> bool:
        target = getattr(slo, kind) if slo else None
        value = ttft_value(e) if kind == "ttft" else e.tpot_ms
        return target is not None and value is not None

    def met(e: Event, kind: str) -> bool:
        value = ttft_value(e) if kind == "ttft" else e.tpot_ms
        return judged(e, kind) and value <= getattr(slo, kind).threshold_ms

    for kind in ("ttft", "tpot"):
        j = [e for e in ev if judged(e, kind)]
        out[f"{kind}_attainment"] = sum(met(e, kind) for e in j) / len(j) if j else None
    good = [
        e
        for e in ev
        if e.status == "ok" and all(not judged(e, k) or met(e, k) for k in ("ttft", "tpot"))
    ]
    out["good"] = len(good)
    out["goodput_ratio"] = len(good) / n
    return out


def rows_by(table, key: str = "lane") -> dict[str, dict[str, Any]]:
    return {r[key]: r for r in table.records()}


def assert_matches(got: dict[str, Any], want: dict[str, Any]) -> None:
    for k, v in want.items():
        if v is None:
            assert got[k] is None, k
        elif isinstance(v, float):
            assert got[k] == pytest.approx(v, abs=1e-3), k
        else:
            assert got[k] == v, k


def test_summary_matches_direct_computation_per_lane(mixed_log):
    """Counts, rates, phase/TTFT/TPOT/ITL percentiles, SLOs and goodput equal plain Python."""
    path, events = mixed_log
    got = rows_by(summary(Scan([str(path)]), CONFIG))
    assert set(got) == {"chat", "rag", "batch", "canary"}
    for lane in got:
        assert_matches(got[lane], expected_lane(events, lane))


def test_summary_rows_follow_config_order_then_unknown_lanes(mixed_log):
    """Lanes come in config order, lanes the config lacks after them."""
    path, _ = mixed_log
    lanes = summary(Scan([str(path)]), CONFIG).values("lane")
    assert lanes == ["rag", "batch", "chat", "canary"]


def test_non_streamed_requests_are_judged_on_e2e(mixed_log):
    """A non-streamed ok request meets the TTFT SLO iff its e2e is within the threshold."""
    path, events = mixed_log
    chat = rows_by(summary(Scan([str(path)]), CONFIG))["chat"]
    values = [(e, v) for e in events if e.lane == "chat" and (v := ttft_value(e)) is not None]
    judged = [e for e, _ in values]
    assert any(not e.stream for e in judged)
    assert chat["ttft_judged"] == len(judged)
    met = sum(v <= 500 for _, v in values)
    assert chat["ttft_attainment"] == pytest.approx(met / len(judged))


def test_slo_verdicts_compare_attainment_with_objectives(mixed_log):
    """*_slo_met is attainment >= objective; slo_met needs all met; batch has no latency SLO."""
    path, _ = mixed_log
    got = rows_by(summary(Scan([str(path)]), CONFIG))
    chat = got["chat"]
    assert chat["ttft_slo_ms"] == 500.0 and chat["ttft_objective"] == 0.95
    assert chat["ttft_slo_met"] is (chat["ttft_attainment"] >= 0.95)
    assert chat["availability_slo_met"] is (chat["availability"] >= 0.995)
    assert chat["slo_met"] is False
    assert got["batch"]["ttft_slo_ms"] is None and got["batch"]["ttft_slo_met"] is None
    assert got["batch"]["goodput_ratio"] == pytest.approx(4 / 5)
    assert got["canary"]["slo_met"] is None


def test_summary_by_pool_judges_each_request_against_its_own_lane(mixed_log):
    """--by pool aggregates per pool while SLO judgments still use each request's lane."""
    path, events = mixed_log
    got = rows_by(summary(Scan([str(path)]), CONFIG, by="pool"), "pool")
    assert set(got) == {"interactive", "bulk"}
    lanes = {"interactive": ("chat", "rag", "canary"), "bulk": ("batch",)}
    for pool, members in lanes.items():
        want = [expected_lane(events, lane) for lane in members]
        assert got[pool]["requests"] == sum(w["requests"] for w in want)
        assert got[pool]["good"] == sum(w["good"] for w in want)
        ev = [e for e in events if e.pool == pool and e.status == "ok"]
        assert got[pool]["e2e_p95_ms"] == pytest.approx(pct([e.e2e_ms for e in ev], 0.95), abs=1e-3)


def test_status_filter_switches_latency_population(mixed_log):
    """With --status, percentiles describe the selected requests instead of the ok ones."""
    path, events = mixed_log
    got = rows_by(summary(Scan([str(path)], Filters.parse(status=["error"])), CONFIG))
    assert set(got) == {"chat", "rag"}
    chat_err = [e.prefill_ms for e in events if e.lane == "chat" and e.status == "error"]
    assert got["chat"]["prefill_p50_ms"] == pytest.approx(pct(chat_err, 0.5))
    assert got["chat"]["error_rate"] == 1.0


@pytest.mark.parametrize(
    "filters, keep",
    [
        (Filters.parse(lane=["chat,rag"]), lambda e: e.lane in ("chat", "rag")),
        (Filters.parse(tenant=["t2"]), lambda e: e.tenant == "t2"),
        (Filters.parse(model=["big"]), lambda e: e.model == "big"),
        (Filters.parse(pool=["bulk"]), lambda e: e.pool == "bulk"),
        (
            Filters.parse(since="2025-06-02T12:01:00Z", until="2025-06-02T14:04:00+02:00"),
            lambda e: "12:01:00" <= e.ts[11:19] < "12:04:00",
        ),
    ],
)
def test_filters_select_the_same_events_as_direct_filtering(mixed_log, filters, keep):
    """Lane, tenant, model, pool and time-window filters keep exactly the matching events."""
    path, events = mixed_log
    kept = [e for e in events if keep(e)]
    got = rows_by(summary(Scan([str(path)], filters), CONFIG))
    assert sum(r["requests"] for r in got.values()) == len(kept)
    for lane, row in got.items():
        assert_matches(row, expected_lane(kept, lane))


def test_relative_since_is_measured_from_now(mixed_log):
    """--since 5m counts back from the current time (injectable for tests)."""
    path, events = mixed_log
    now = T0.replace(minute=10)
    f = Filters.parse(since="5m", now=now)
    got = summary(Scan([str(path)], f), CONFIG)
    assert sum(got.values("requests")) == sum(e.ts[11:19] >= "12:05:00" for e in events)


def test_no_matching_events_gives_an_empty_table(mixed_log):
    """A filter that matches nothing yields no rows, not an error."""
    path, _ = mixed_log
    assert len(summary(Scan([str(path)], Filters.parse(lane=["nope"])), CONFIG)) == 0


def test_events_without_a_lane_group_under_null(tmp_path: Path):
    """Events lacking a lane, or with unknown lanes, are summarised after the known lanes."""
    lines = [
        b'{"request_id": "a", "status": "ok", "e2e_ms": 5.0}',
        b'{"request_id": "b", "lane": "zeta", "status": "ok", "e2e_ms": 7.0}',
        b'{"request_id": "c", "lane": "chat", "status": "ok", "e2e_ms": 3.0}',
        b'{"request_id": "d", "lane": "alpha", "status": "ok", "e2e_ms": 2.0}',
    ]
    path = write_jsonl(tmp_path / "e.jsonl", [], extra_lines=lines)
    table = summary(Scan([str(path)]), CONFIG)
    assert table.values("lane") == ["chat", "alpha", "zeta", None]
    assert table.values("e2e_p50_ms") == [3.0, 2.0, 7.0, 5.0]


def test_grouping_by_an_outcome_field_describes_every_request(mixed_log):
    """--by error_class (or status) groups failures; percentiles cover all of a group's requests."""
    path, events = mixed_log
    got = rows_by(summary(Scan([str(path)]), CONFIG, by="error_class"), "error_class")
    classes = {e.error_class for e in events}
    assert set(got) == classes
    timeouts = [e.prefill_ms for e in events if e.error_class == "upstream_timeout"]
    assert got["upstream_timeout"]["requests"] == len(timeouts)
    assert got["upstream_timeout"]["prefill_p50_ms"] == pytest.approx(pct(timeouts, 0.5))
    by_replica = summary(Scan([str(path)]), CONFIG, by="replica")
    assert by_replica.values("requests") == [len(events)]  # the fixture sets no replica


def test_a_summary_record_counts_as_the_requests_it_stands_for(tmp_path: Path):
    """A record with ``summarized`` n counts as n requests of its outcome in rates and goodput."""
    lines = [
        b'{"request_id": "a", "lane": "chat", "status": "ok", "stream": true, "e2e_ms": 5.0}',
        b'{"request_id": "b", "lane": "chat", "status": "rejected", "e2e_ms": 0.1}',
        b'{"request_id": "summary-1", "lane": "chat", "status": "rejected", "summarized": 98}',
    ]
    path = write_jsonl(tmp_path / "e.jsonl", [], extra_lines=lines)
    row = rows_by(summary(Scan([str(path)]), CONFIG))["chat"]
    assert row["requests"] == 100
    assert row["rejection_rate"] == pytest.approx(0.99)
    assert row["error_rate"] == 0
    assert row["ok"] == 1
