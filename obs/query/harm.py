"""Who hurt whom: an incident as trigger, victims, mechanism and lever, per pool.

From the events of a window and the misses ``obs.query.error_budget.spending`` charges (each
miss's phase and cause from ``error_budget.causes``: the one answer ``budget``, ``show`` and
the alerts give):

* **The incident's window**: a pool's misses, split where none came for ``GAP_S``; it starts
  at the first missed request's arrival and ends at the last one's first token (its end).
* **The trigger**: the lane (and tenant) whose prompt tokens rose most in the window over its
  own rate outside it (the whole run when there is no outside): its requests, prompt tokens
  and when they came.
* **The victims**: every other lane that missed in the window on the pool, ranked by harm:
  missed requests, then users hurt (tenants, else requests), never by budget percent; a lane
  with fewer than ``SMALL_LANE`` requests on the pool is flagged ``small``. ``trigger_share``: of
  the victim's missed requests' wait (arrival to first token), the share during which a
  trigger request that arrived before it was in flight on the same replica.
* **The mechanism**: from the victims' causes and the replicas' state at dispatch (the
  events' ``pool_*`` fields): one slow replica (its TTFT far from its pool's others', same
  lanes and window), KV preemption, slot-bound queueing (every batch slot taken at dispatch),
  token-budget-bound queueing (slots free, prompts ahead: the per-step token budget,
  ``--max-num-batched-tokens``), long prefills ahead; and what was fine (KV, other pools).
* **The lever** that fits the mechanism and the lanes, naming the config keys.

Only the events within ``PAD`` of a miss are read one by one; the rest of the log as sums per
pool and lane (the trigger's baseline, each lane's requests).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from obs.config import Config
from obs.conventions import CAUSE_WORDS
from obs.query.error_budget import as_utc, spending
from obs.query.scan import Source

GAP_S = 60.0  # misses of a pool this far apart are two incidents
PAD = timedelta(minutes=10)  # events read either side of a miss (its wait, the trigger's lead)
MAX_WINDOWS = 200
SMALL_LANE = 10  # a lane with fewer requests judged than this is flagged small
SLOW_REPLICA_RATIO = 3.0  # a replica's median TTFT this many times its pool's others'
SLOW_REPLICA_SHARE = 0.6  # ... holding this share of the window's misses: the mechanism
KV_HIGH = 0.9  # KV usage at dispatch from which a miss counts as KV-bound
COLUMNS = (
    "request_id", "lane", "tenant", "pool", "replica", "status", "prompt_tokens", "upload_ms",
    "queue_ms", "prefill_ms", "first_token_ms", "ttft_ms", "e2e_ms", "summarized",
    "pool_in_flight", "pool_max_running", "pool_kv_usage", "pool_preempting",
    "pool_ahead_prompt_tokens", "pool_others_prompt_share",
)  # fmt: skip
ms = timedelta(milliseconds=1)


@dataclass(slots=True)
class Req:
    """One event, as the story reads it."""

    row: dict[str, Any]
    t: datetime  # arrival (after its upload)
    first: datetime  # first token (its end without one)
    end: datetime
    misses: list[tuple[str, str, str]] = field(default_factory=list)  # (slo, phase, cause)


@dataclass(slots=True)
class Usage:
    """A pool's whole log: prompt tokens per lane, and its first and last arrival (the
    trigger's baseline rate)."""

    tokens: Counter[str] = field(default_factory=Counter)
    requests: Counter[str] = field(default_factory=Counter)
    first: datetime | None = None
    last: datetime | None = None


def _usage(scan: Source) -> dict[str, Usage]:
    col = scan.dialect.ts_column
    out: dict[str, Usage] = defaultdict(Usage)
    for pool, lane, n, tokens, lo, hi in scan.run(
        f"SELECT pool, lane, count(*), sum(coalesce(prompt_tokens, 0)), min({col}), max({col}) "
        f"FROM {scan.source} WHERE summarized IS NULL GROUP BY pool, lane"
    ).rows:
        u = out[str(pool)]
        u.tokens[str(lane)] += int(tokens or 0)
        u.requests[str(lane)] += int(n or 0)
        if lo is not None and hi is not None:
            lo, hi = as_utc(lo), as_utc(hi)
            u.first = lo if u.first is None else min(u.first, lo)
            u.last = hi if u.last is None else max(u.last, hi)
    return out


def _windows(times: list[datetime]) -> list[tuple[datetime, datetime]]:
    """The spans around the misses whose events the story reads (``PAD`` either side)."""
    out: list[tuple[datetime, datetime]] = []
    for t in sorted(times):
        if out and t - PAD <= out[-1][1]:
            out[-1] = (out[-1][0], t + PAD)
        else:
            out.append((t - PAD, t + PAD))
    if len(out) > MAX_WINDOWS:  # one span, not a query of thousands of ranges
        out = [(out[0][0], out[-1][1])]
    return out


def _reqs(scan: Source, windows: list[tuple[datetime, datetime]]) -> list[Req]:
    """The events in ``windows``, by arrival."""
    if not windows:
        return []
    d, col = scan.dialect, scan.dialect.ts_column
    spans = " OR ".join(
        f"({col} >= {d.ts_literal(lo)} AND {col} <= {d.ts_literal(hi)})" for lo, hi in windows
    )
    rows = scan.run(
        f"SELECT {', '.join(COLUMNS)}, {col} AS _t FROM {scan.source} "
        f"WHERE summarized IS NULL AND ({spans})"
    ).records()
    out = []
    for r in rows:
        t = as_utc(r["_t"]) + (r["upload_ms"] or 0.0) * ms
        wait = r["ttft_ms"]
        if wait is None:
            wait = (r["queue_ms"] or 0.0) + (r["prefill_ms"] or 0.0) + (r["first_token_ms"] or 0.0)
        out.append(Req(r, t, t + wait * ms, t + (r["e2e_ms"] or 0.0) * ms))
    out.sort(key=lambda q: q.t)
    return out


def stories(scan: Source, config: Config) -> list[dict[str, Any]]:
    """Every incident in the scan's window, first first (see the module's doc). Only the
    events around the misses are read one by one; the rest of the log as sums per lane."""
    spent = spending(scan, config)
    reqs = _reqs(scan, _windows([as_utc(row["_t"]) for s in spent for _, row in s.misses]))
    usage = _usage(scan) if reqs else {}
    index = {(q.row["request_id"], q.t.replace(microsecond=0)): q for q in reqs}
    by_id = {q.row["request_id"]: q for q in reqs}
    for s in spent:
        for m, row in s.misses:
            t = as_utc(row["_t"]) + (row["upload_ms"] or 0.0) * ms
            q = index.get((row["request_id"], t.replace(microsecond=0))) or by_id.get(
                row["request_id"]
            )
            if q is not None:
                q.misses.append((m.slo, m.phase, m.cause))
    pools: dict[str, list[Req]] = defaultdict(list)
    for q in reqs:
        pools[str(q.row["pool"])].append(q)
    out = []
    for pool, pool_reqs in pools.items():
        for missed in _clusters([q for q in pool_reqs if q.misses]):
            out.append(_story(pool, missed, pool_reqs, reqs, usage[pool]))
    out.sort(key=lambda s: (s["start"], s["pool"]))
    return out


def _clusters(missed: list[Req]) -> Iterable[list[Req]]:
    group: list[Req] = []
    for q in missed:
        if group and (q.t - max(g.first for g in group)).total_seconds() > GAP_S:
            yield group
            group = []
        group.append(q)
    if group:
        yield group


def _story(
    pool: str, missed: list[Req], pool_reqs: list[Req], every: list[Req], usage: Usage
) -> dict[str, Any]:
    start, end = missed[0].t, max(q.first for q in missed)
    lead = max(q.first - q.t for q in missed)  # a request ahead came at most one wait before
    inside = [q for q in pool_reqs if start - lead <= q.t <= end]
    trigger = _trigger(inside, usage, start, end)
    t_lane = trigger["lane"]
    t_reqs = [q for q in inside if q.row["lane"] == t_lane]
    if t_reqs:
        start = min(start, t_reqs[0].t)
    victims = _victims([q for q in missed if q.row["lane"] != t_lane], t_reqs, usage.requests)
    trigger["missed"] = sum(1 for q in missed if q.row["lane"] == t_lane)
    mech = _mechanism(pool, [q for q in missed if q.row["lane"] != t_lane] or missed, pool_reqs,
                      every, start, end)  # fmt: skip
    lever = _lever(mech["kind"], pool, t_lane, victims, mech)
    if mech["kind"] != mech["cause"]:  # the cause show, budget and the alerts name
        mech["line"] += f" (cause {mech['cause']}, as show, budget and the alerts say)"
    return {
        "pool": pool,
        "start": _iso(start),
        "end": _iso(end),
        "trigger": trigger,
        "victims": victims,
        "mechanism": mech["line"],
        "mechanism_kind": mech["kind"],
        "cause": mech["cause"],
        "fine": mech["fine"],
        "slow_replica": mech.get("replica"),
        "lever": lever,
    }


def _iso(t: datetime) -> str:
    return t.isoformat(timespec="seconds")


def _trigger(inside: list[Req], usage: Usage, start: datetime, end: datetime) -> dict[str, Any]:
    """The lane (and its tenant) whose prompt tokens rose most in the window over its own
    rate outside it (over the pool's whole log)."""
    lo = min((q.t for q in inside), default=start)
    span = max(1.0, (end - lo).total_seconds())
    whole = (usage.last - usage.first).total_seconds() if usage.first and usage.last else 0.0
    outside_s = max(0.0, whole - span)
    tokens_in: Counter[str] = Counter()
    tokens_all = usage.tokens
    for q in inside:
        tokens_in[str(q.row["lane"])] += q.row["prompt_tokens"] or 0

    def excess(lane: str) -> float:
        outside = tokens_all[lane] - tokens_in[lane]
        rate = outside / outside_s if outside_s > 0 else 0.0
        return tokens_in[lane] - rate * span

    if not inside:
        return {"lane": None, "tenant": None, "requests": 0, "prompt_tokens": 0}
    lane = max(tokens_in, key=lambda k: (excess(k), k))
    mine = [q for q in inside if q.row["lane"] == lane]
    # The tenant, when one sent most of the lane's prompt tokens in the window.
    weights: Counter[str] = Counter()
    for q in mine:
        if q.row["tenant"]:
            weights[str(q.row["tenant"])] += q.row["prompt_tokens"] or 1
    tenant, top = weights.most_common(1)[0] if weights else (None, 0)
    total = sum(q.row["prompt_tokens"] or 1 for q in mine)
    return {
        "lane": lane,
        "tenant": tenant if 2 * top > total else None,
        "requests": len(mine),
        "prompt_tokens": tokens_in[lane],
        "from": _iso(mine[0].t),
        "until": _iso(mine[-1].t),
        "excess_prompt_tokens": round(excess(lane)),
    }


def _victims(missed: list[Req], t_reqs: list[Req], judged: Counter[str]) -> list[dict[str, Any]]:
    """The lanes that missed, ranked by harm; ``judged``: each lane's requests on the pool."""
    lanes: dict[str, list[Req]] = defaultdict(list)
    for q in missed:
        lanes[str(q.row["lane"])].append(q)
    out: list[dict[str, Any]] = []
    for lane, qs in lanes.items():
        tenants = {q.row["tenant"] for q in qs if q.row["tenant"]}
        waited = ahead = 0.0
        for q in qs:
            w, a = _ahead(q, t_reqs)
            waited, ahead = waited + w, ahead + a
        shares = [q.row["pool_others_prompt_share"] for q in qs]
        shares = [s for s in shares if s is not None]
        slos = Counter(slo for q in qs for slo, _, _ in q.misses[:1])
        out.append(
            {
                "lane": lane,
                "requests": judged[lane],
                "missed": len(qs),
                "trigger_share": round(ahead / waited, 3) if waited > 0 else 0.0,
                "users": len(tenants) or len(qs),
                "small": judged[lane] < SMALL_LANE,
                "missed_by_slo": dict(sorted(slos.items())),
                "others_prompt_share": round(statistics.fmean(shares), 3) if shares else None,
                "ttft_p95_ms": _p95([q.row["ttft_ms"] for q in qs]),
            }
        )
    out.sort(key=lambda v: (-v["missed"], -v["users"], v["small"], v["lane"]))
    return out


def _p95(values: list[Any]) -> float | None:
    vs = sorted(float(v) for v in values if v is not None)
    return round(vs[min(len(vs) - 1, int(0.95 * len(vs)))], 1) if vs else None


def _ahead(q: Req, t_reqs: list[Req]) -> tuple[float, float]:
    """(q's wait in s, of it the time a trigger request that came before it was in flight on
    its replica)."""
    lo, hi = q.t, q.first
    wait = (hi - lo).total_seconds()
    spans = sorted(
        (max(lo, t.t), min(hi, t.end))
        for t in t_reqs
        if t.t <= q.t and t.row["replica"] == q.row["replica"] and t.end > lo and t.t < hi
    )
    covered, reach = 0.0, lo
    for a, b in spans:
        a = max(a, reach)
        if b > a:
            covered += (b - a).total_seconds()
            reach = b
    return wait, covered


def _mechanism(
    pool: str, missed: list[Req], pool_reqs: list[Req], every: list[Req], start: datetime,
    end: datetime,
) -> dict[str, Any]:  # fmt: skip
    # The cause behind most of the misses' first gates (error_budget.causes: the sidecar's
    # stamp where the event has one, what `show`, `budget` and the alerts' burn by cause say).
    causes = Counter(cause for q in missed for _, _, cause in q.misses[:1])
    cause = causes.most_common(1)[0][0] if causes else "other"
    window = [q for q in pool_reqs if start <= q.t <= end]
    kv = [float(q.row["pool_kv_usage"]) for q in window if q.row["pool_kv_usage"] is not None]
    preempted = sum(1 for q in missed if q.row["pool_preempting"])
    fine = []
    kv_max = max(kv, default=None)
    if kv_max is not None and kv_max < KV_HIGH and not preempted:
        fine.append(f"KV cache (at most {kv_max:.0%}, no preemption)")
    others: defaultdict[str, list[int]] = defaultdict(lambda: [0, 0])
    for q in every:
        p = str(q.row["pool"])
        if p != pool and start <= q.t <= end:
            others[p][0] += 1
            others[p][1] += bool(q.misses)
    fine += [
        f"pool {p} ({n} request{'s' if n != 1 else ''}, none missed)"
        for p, (n, m) in sorted(others.items())
        if not m
    ]
    base: dict[str, Any] = {"cause": cause, "fine": fine}
    slow = _slow_replica(missed, window)
    if slow is not None:
        return {
            "kind": "slow_replica", **base, "replica": slow["replica"],
            "line": f"one slow replica: {slow['replica']} took TTFT p50 {slow['p50_ms']:.0f} ms "
            f"against {slow['pool_p50_ms']:.0f} ms on the pool's others, {slow['share']:.0%} "
            "of the misses",
        }  # fmt: skip
    if preempted * 2 >= len(missed) or ((kv_max or 0.0) >= KV_HIGH and cause == "kv_pressure"):
        return {"kind": "kv_preemption", **base,
                "line": f"KV preemption: the KV cache was short (at most {kv_max or 0:.0%}, "
                f"{preempted} misses sent while preempting)"}  # fmt: skip
    slots = [q for q in missed if q.row["pool_max_running"] and q.row["pool_in_flight"] is not None]
    full = [q for q in slots if q.row["pool_in_flight"] + 1 > q.row["pool_max_running"]]
    top = max((q.row["pool_in_flight"] + 1 for q in slots), default=None)
    cap = max((q.row["pool_max_running"] for q in slots), default=None)
    ahead = max((q.row["pool_ahead_prompt_tokens"] or 0 for q in missed), default=0)
    queued = cause in ("engine_queue", "prefills_ahead", "admission_queue")
    if queued and slots and len(full) * 2 > len(slots):
        return {"kind": "slot_bound", **base,
                "line": f"slot-bound queueing: every batch slot was taken ({len(full)} of "
                f"{len(slots)} misses sent with {cap} of {cap} in flight)"}  # fmt: skip
    if queued and slots:
        return {"kind": "token_budget_bound", **base,
                "line": f"token-budget-bound queueing: slots were free (at most {top} of {cap} "
                f"in flight) but up to {ahead} prompt tokens ahead waited on the per-step "
                "token budget (--max-num-batched-tokens)"}  # fmt: skip
    if queued:
        return {
            **base,
            "kind": "long_prefills",
            "line": f"long prefills ahead: up to {ahead} prompt tokens in flight ahead",
        }
    return {"kind": cause, **base,
            "line": f"{cause.replace('_', ' ')}: {CAUSE_WORDS[cause][0]}"}  # fmt: skip


def _slow_replica(missed: list[Req], window: list[Req]) -> dict[str, Any] | None:
    """The replica whose TTFT sits far outside its pool's others' (same lanes, same window)
    and that holds most of the misses; None when there is none."""
    lanes = {q.row["lane"] for q in missed}
    ttft: dict[str, list[float]] = defaultdict(list)
    for q in window:
        if q.row["lane"] in lanes and q.row["ttft_ms"] is not None and q.row["replica"]:
            ttft[str(q.row["replica"])].append(float(q.row["ttft_ms"]))
    if len(ttft) < 2:
        return None
    counts = Counter(str(q.row["replica"]) for q in missed)
    rep, n = counts.most_common(1)[0]
    rest = [v for r, vs in ttft.items() if r != rep for v in vs]
    if rep not in ttft or not rest or n < SLOW_REPLICA_SHARE * len(missed):
        return None
    mine, theirs = statistics.median(ttft[rep]), statistics.median(rest)
    if mine < SLOW_REPLICA_RATIO * max(theirs, 1.0):
        return None
    return {"replica": rep, "p50_ms": mine, "pool_p50_ms": theirs, "share": n / len(missed)}


def _lever(
    kind: str, pool: str, lane: str | None, victims: list[dict[str, Any]], mech: dict[str, Any]
) -> str:
    """The lever that fits the mechanism and the lanes, naming the config keys."""
    own = (
        f"move lane {lane} to its own pool (its `pool:` in the lanes config, a pool with its "
        "own replicas) so its prefills stop sharing steps with "
        + ", ".join(v["lane"] for v in victims[:3])
        if lane and victims
        else None
    )
    if kind == "slow_replica":
        return (
            f"drain replica {mech['replica']} (take it out of pool {pool}'s `replicas:`) and "
            "check its GPU (VllmObsGPUThrottled, VllmObsGPUXidError)"
        )
    if kind == "kv_preemption":
        base = "more KV cache (--gpu-memory-utilization, a shorter --max-model-len), fewer "
        base += "sequences (--max-num-seqs), or more replicas"
        return f"{base}; or {own}" if own else base
    if kind == "slot_bound":
        tail = f"more slots (--max-num-seqs) or replicas in pool {pool}"
    elif kind in ("token_budget_bound", "long_prefills"):
        tail = (
            f"cap lane {lane}'s prompts (admission.max_prompt_tokens), or chunk prefills "
            "(--max-num-batched-tokens, --long-prefill-token-threshold)"
        )
    else:
        tail = CAUSE_WORDS.get(kind, CAUSE_WORDS["other"])[1]
    return f"{own}; or {tail}" if own else tail
