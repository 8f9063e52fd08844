"""``query slowest`` and ``query show``: the right requests, their phases, the waterfall."""

from __future__ import annotations

import pytest

from obs.errors import InputError
from obs.query.filters import Filters
from obs.query.requests import describe, find, phase_spans, slowest, waterfall
from obs.query.scan import Scan
from obs.query.testing import event

pytestmark = pytest.mark.inproc


@pytest.mark.parametrize(
    "by, column",
    [("e2e", "e2e_ms"), ("ttft", "ttft_ms"), ("queue", "queue_ms"), ("tpot_ms", "tpot_ms")],
)
def test_slowest_returns_the_top_n_by_the_timing(mixed_log, by, column):
    """The N largest values, largest first (ties: earlier first), any status, nulls unranked."""
    path, events = mixed_log
    table = slowest(Scan([path]), by, 5)
    ranked = sorted(
        (e for e in events if getattr(e, column) is not None),
        key=lambda e: (-getattr(e, column), e.ts),
    )
    assert table.values("request_id") == [e.request_id for e in ranked[:5]]
    assert table.values(column) == [getattr(e, column) for e in ranked[:5]]


def test_slowest_rows_carry_the_phase_breakdown(mixed_log):
    """Each row has the five phases, which sum to its e2e."""
    path, events = mixed_log
    by_id = {e.request_id: e for e in events}
    for rec in slowest(Scan([path]), "e2e", 3).records():
        e = by_id[rec["request_id"]]
        phases = [rec[f"{p}_ms"] for p in ("queue", "prefill", "first_token", "decode", "stream")]
        assert phases == [e.queue_ms, e.prefill_ms, e.first_token_ms, e.decode_ms, e.stream_ms]
        assert sum(phases) == pytest.approx(rec["e2e_ms"])


def test_slowest_respects_filters(mixed_log):
    """--lane narrows the ranking to that lane."""
    path, events = mixed_log
    table = slowest(Scan([path], Filters.parse(lane=["chat"])), "e2e", 50)
    assert set(table.values("lane")) == {"chat"}
    assert len(table) == sum(e.lane == "chat" for e in events)


def test_slowest_rejects_unknown_timings_and_bad_n(mixed_log):
    """An unknown timing or n < 1 is an InputError."""
    path, _ = mixed_log
    with pytest.raises(InputError, match="unknown timing"):
        slowest(Scan([path]), "latency", 5)
    with pytest.raises(InputError, match="at least 1"):
        slowest(Scan([path]), "e2e", 0)


def test_show_finds_by_request_id_trace_id_and_unique_prefix(mixed_log):
    """An exact request id, a trace id or a unique prefix finds the event with every field."""
    path, events = mixed_log
    e = events[3]
    got = find(Scan([path]), e.request_id)
    assert got["request_id"] == e.request_id
    assert {k: v for k, v in got.items() if k != "ts"} == {
        k: v for k, v in e.to_dict().items() if k != "ts"
    }
    assert got["ts"].isoformat(timespec="milliseconds") + "Z" == e.ts
    assert find(Scan([path]), e.trace_id or "")["request_id"] == e.request_id
    assert find(Scan([path]), "req-0027")["request_id"] == "req-0027"


def test_show_reports_missing_and_ambiguous_ids(mixed_log):
    """No match and a prefix matching several requests are InputErrors with the candidates."""
    path, _ = mixed_log
    with pytest.raises(InputError, match="no request"):
        find(Scan([path]), "nope")
    with pytest.raises(InputError, match="ambiguous"):
        find(Scan([path]), "req-00")


def test_waterfall_draws_each_phase_to_scale():
    """Bars start where the previous phase ended and are as long as the phase."""
    e = event(
        queue_ms=100.0, prefill_ms=300.0, first_token_ms=0.0, decode_ms=500.0, stream_ms=100.0
    )
    text = waterfall(e.to_dict(), width=50)
    lines = {line.split()[0]: line for line in text.splitlines()[1:6]}
    bars = {k: v.split("|")[1] for k, v in lines.items()}
    assert bars["queue"].rstrip() == "\u2588" * 5
    assert bars["prefill"].rstrip() == " " * 5 + "\u2588" * 15
    assert bars["first_token"].strip() == ""
    assert bars["decode"].rstrip() == " " * 20 + "\u2588" * 25
    assert bars["stream"].rstrip() == " " * 45 + "\u2588" * 5
    assert "e2e 1,000.0 ms" in text and "ttft 400.0 ms" in text
    assert phase_spans(e.to_dict())[3] == ("decode", 400.0, 500.0)


def test_describe_lists_every_field_then_the_waterfall(mixed_log):
    """show's text output names every event field and ends with the waterfall."""
    path, events = mixed_log
    text = describe(find(Scan([path]), events[0].request_id))
    for name in events[0].to_dict():
        assert f"\n{name} " in "\n" + text
    assert "phase" in text and "decode" in text


@pytest.mark.parametrize("odd", ["it's", "{src}", "%", "req-0001' OR '1'='1"])
def test_show_quotes_odd_ids_safely(mixed_log, odd):
    """Quotes, braces and wildcards in an id are matched literally."""
    path, _ = mixed_log
    with pytest.raises(InputError, match="no request"):
        find(Scan([path]), odd)
