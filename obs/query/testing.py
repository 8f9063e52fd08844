"""Helpers to build small event logs with known contents (for tests, yours and ours).

    from obs.query.testing import event, write_jsonl

    write_jsonl(tmp_path / "events.jsonl", [event(lane="chat", ttft_ms=120.0), ...])

``event`` fills the phases consistently: give any of the five phase
durations and ``e2e_ms`` becomes their sum; streamed ``ok`` requests get
``ttft_ms = queue + prefill + first_token`` unless given.
"""

from __future__ import annotations

import gzip
import itertools
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from obs.conventions import PHASES
from obs.events import Event

_ids = itertools.count(1)
T0 = datetime(2025, 6, 2, 12, 0, 0, tzinfo=UTC)


def ts(offset_s: float = 0.0, start: datetime = T0) -> str:
    """An event timestamp ``offset_s`` seconds after ``start`` (ISO 8601, ms, Z)."""
    t = start + timedelta(seconds=offset_s)
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def event(**fields: Any) -> Event:
    """An ``Event`` with defaults filled in and phases that add up."""
    fields.setdefault("request_id", f"req-{next(_ids):06d}")
    fields.setdefault("ts", ts(0))
    fields.setdefault("stream", True)
    fields.setdefault("status", "ok")
    for p in PHASES:
        fields.setdefault(f"{p}_ms", 0.0)
    fields.setdefault("e2e_ms", round(sum(fields[f"{p}_ms"] for p in PHASES), 3))
    if fields["stream"] and fields["status"] == "ok" and "ttft_ms" not in fields:
        fields["ttft_ms"] = round(
            fields["queue_ms"] + fields["prefill_ms"] + fields["first_token_ms"], 3
        )
    return Event(**fields)


def write_jsonl(
    path: str | Path,
    events: Iterable[Event],
    compress: bool = False,
    extra_lines: Iterable[bytes] = (),
    truncated_tail: bytes | None = None,
) -> Path:
    """Write events as JSONL (gzip when ``compress``), then ``extra_lines`` and a cut-off tail."""
    path = Path(path)
    data = b"".join(e.to_json() for e in events)
    data += b"".join(line.rstrip(b"\n") + b"\n" for line in extra_lines)
    if truncated_tail is not None:
        data += truncated_tail
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


# Streamed ok rows: (queue, prefill, first_token, decode, stream, tpot, itl_p50, cache_hit).
Streamed = tuple[float, float, float, float, float, float, float, bool]
CHAT_OK: tuple[Streamed, ...] = (
    (1.0, 120.0, 0.5, 900.0, 0.4, 18.0, 17.0, False),
    (2.5, 80.0, 0.3, 1200.0, 0.2, 21.0, 20.0, True),
    (0.5, 610.0, 0.7, 400.0, 0.3, 35.0, 33.0, False),
    (3.0, 95.0, 0.2, 2500.0, 0.5, 19.5, 18.0, True),
    (250.0, 300.0, 0.4, 800.0, 0.1, 55.0, 52.0, False),  # slow queue, TPOT over 50
    (1.5, 140.0, 0.6, 950.0, 0.6, 22.0, 21.0, False),
    (0.8, 75.0, 0.3, 3100.0, 0.2, 16.0, 15.5, True),
    (4.0, 205.0, 0.5, 700.0, 0.3, 48.0, 45.0, False),
)
RAG_OK: tuple[Streamed, ...] = (  # mostly cached
    (2.0, 900.0, 0.5, 1500.0, 0.3, 25.0, 24.0, True),
    (1.0, 1200.0, 0.4, 1700.0, 0.2, 26.0, 25.0, True),
    (5.0, 450.0, 0.6, 1300.0, 0.4, 24.0, 23.0, True),
    (3.0, 1020.0, 0.3, 2100.0, 0.5, 61.0, 58.0, False),
    (1.5, 700.0, 0.2, 1600.0, 0.1, 27.0, 26.0, True),
    (0.5, 980.0, 0.7, 1400.0, 0.2, 23.0, 22.0, True),
)
POOLS = {"chat": "interactive", "rag": "interactive", "batch": "bulk", "canary": "interactive"}


def _streamed(lane: str, row: Streamed, prompt: int, cached: int, out: int) -> dict[str, Any]:
    q, p, f, d, s, tpot, itl, hit = row
    phases = dict(queue_ms=q, prefill_ms=p, first_token_ms=f, decode_ms=d, stream_ms=s)
    tokens = dict(prompt_tokens=prompt, cached_tokens=cached if hit else 0, completion_tokens=out)
    return dict(lane=lane, **phases, tpot_ms=tpot, itl_p50_ms=itl, cache_hit=hit, **tokens)


def _chat_rows() -> list[dict[str, Any]]:
    rows = [{**_streamed("chat", r, 400, 256, 60), "itl_p95_ms": r[6] * 1.5} for r in CHAT_OK]
    # non-streamed ok: judged on TTFT by e2e (one meets 500 ms, one does not)
    rows.append(dict(lane="chat", stream=False, queue_ms=1.0, prefill_ms=430.0, stream_ms=0.5))
    rows.append(dict(lane="chat", stream=False, queue_ms=2.0, prefill_ms=880.0, stream_ms=0.5))
    # failures
    rows.append(
        dict(
            lane="chat",
            status="error",
            queue_ms=2.0,
            prefill_ms=3000.0,
            error_class="upstream_timeout",
        )
    )
    rows.append(
        dict(lane="chat", status="rejected", queue_ms=2000.0, rejection_reason="queue_timeout")
    )
    rows.append(
        dict(
            lane="chat",
            status="client_disconnect",
            queue_ms=1.0,
            prefill_ms=150.0,
            first_token_ms=0.4,
            decode_ms=300.0,
            ttft_ms=151.4,
        )
    )
    rows.append(dict(lane="chat", status="client_error", queue_ms=1.0, prefill_ms=5.0))
    return rows


def _other_rows() -> list[dict[str, Any]]:
    rows = [_streamed("rag", r, 3000, 2048, 80) for r in RAG_OK]
    rows.append(dict(lane="rag", status="error", queue_ms=1.0, prefill_ms=60000.0))
    # batch: non-streamed, no latency SLOs
    for q, p in ((3.0, 20000.0), (1.0, 45000.0), (2.0, 31000.0), (4.0, 12500.0)):
        rows.append(dict(lane="batch", stream=False, queue_ms=q, prefill_ms=p, stream_ms=1.0))
    rows.append(dict(lane="batch", stream=False, status="rejected", queue_ms=0.1))
    # canary: a lane the config does not know
    for q, d in ((1.0, 10.0), (2.0, 20.0)):
        rows.append(
            dict(
                lane="canary",
                queue_ms=q,
                prefill_ms=50.0 + 20 * (q - 1),
                first_token_ms=0.1,
                decode_ms=d,
            )
        )
    return rows


def mixed_events() -> list[Event]:
    """A small log over 10 minutes with known answers: four lanes, every status.

    Lanes ``chat`` and ``rag`` (pool interactive, model small), ``batch``
    (pool bulk, model big, non-streamed) and ``canary`` (a lane no config
    names). Timestamps start at ``T0`` and step 15 s, in list order.
    """
    out = []
    for i, r in enumerate(_chat_rows() + _other_rows()):
        r.setdefault("pool", POOLS[r["lane"]])
        r.setdefault("model", "big" if r["lane"] == "batch" else "small")
        r.setdefault("tenant", "t1" if i % 3 else "t2")
        r.setdefault("request_id", f"req-{i:04d}")
        r.setdefault("trace_id", f"{i:032x}")
        r.setdefault("ts", ts(15.0 * i))
        out.append(event(**r))
    return out
