"""From per-run measurements to the relay benchmark's table (pure: no I/O).

Each relay run is compared with the direct run of the same round (adjacent in
time, so drift on a shared machine hits both): added TTFT, ITL change and the
throughput share are per-round differences or ratios, and the table shows
their median over rounds (one disturbed round cannot move it), with the range
of the throughput share as a noise gauge. Absolute percentiles are pooled
over rounds (every request counts once). The targets' order in each round:
``round_order``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from bench.vllm_bench import RunResult

DIRECT = "direct"


@dataclass
class Run:
    """One target at one load level in one round."""

    round: int
    result: RunResult
    cpu_s: float | None  # the relay's own CPU seconds (None: nothing in between)
    peak_rss_mib: float | None
    sys_cpu_s: float | None = None  # of cpu_s, in the kernel (system time, idle rate not taken off)


@dataclass
class Row:
    level: str
    target: str
    runs: int
    requests: int
    failed: int
    ttft_p50: float
    ttft_p99: float
    added_ttft_p50: float | None
    added_ttft_p99: float | None
    itl_p50: float
    itl_p99: float
    itl_p50_change: float | None
    itl_p99_change: float | None
    tokens_per_s: float
    share_of_direct: float | None
    share_range: tuple[float, float] | None
    added_p50_range: tuple[float, float] | None
    cpu_s_per_1k_requests: float | None
    cpu_s_per_100k_tokens: float | None
    peak_rss_mib: float | None
    extra: dict[str, float] = field(default_factory=dict)


def round_order(names: list[str], rnd: int) -> list[str]:
    """The targets' order in round ``rnd`` (from 1): each pair of rounds runs one order, then
    the same reversed (ABBA), so every two targets swap places within every two rounds, and
    the next pair starts one target later. A plain rotation never swapped two neighbours in
    two rounds: the one after ``direct`` ran just after it both times."""
    k = (rnd - 1) // 2 % len(names)
    order = names[k:] + names[:k]
    return order[::-1] if rnd % 2 == 0 else order


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), q in [0, 100]."""
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _pooled(runs: list[Run], attr: str) -> list[float]:
    return [v for r in runs for v in getattr(r.result, attr)]


def _cpu(runs: list[Run], per: float, attr: str) -> float | None:
    cpu = [r.cpu_s for r in runs]
    if any(c is None for c in cpu):
        return None
    total = sum(getattr(r.result, attr) for r in runs)
    return sum(c for c in cpu if c is not None) / total * per if total else None


def _paired(runs: list[Run], direct: dict[int, Run], attr: str, q: float) -> float | None:
    """Median over rounds of (this run's percentile - the same round's direct percentile)."""
    diffs = [
        percentile(getattr(r.result, attr), q)
        - percentile(getattr(direct[r.round].result, attr), q)
        for r in runs
        if r.round in direct
    ]
    return statistics.median(diffs) if diffs else None


def rows(level: str, by_target: dict[str, list[Run]]) -> list[Row]:
    """One row per target; ``direct`` (if present) is the reference."""
    direct = by_target.get(DIRECT, [])
    d_by_round = {r.round: r for r in direct}
    out = []
    for target, runs in by_target.items():
        ttft = _pooled(runs, "ttfts_ms")
        itl = _pooled(runs, "itls_ms")
        ratios = [
            r.result.tokens_per_s / d_by_round[r.round].result.tokens_per_s
            for r in runs
            if r.round in d_by_round and d_by_round[r.round].result.tokens_per_s
        ]
        added_p50 = [
            percentile(r.result.ttfts_ms, 50) - percentile(d_by_round[r.round].result.ttfts_ms, 50)
            for r in runs
            if r.round in d_by_round
        ]
        has_ref = bool(direct) and target != DIRECT
        paired = has_ref and bool(added_p50)
        rss = [r.peak_rss_mib for r in runs if r.peak_rss_mib is not None]
        out.append(
            Row(
                level=level,
                target=target,
                runs=len(runs),
                requests=sum(r.result.completed for r in runs),
                failed=sum(r.result.failed for r in runs),
                ttft_p50=percentile(ttft, 50),
                ttft_p99=percentile(ttft, 99),
                added_ttft_p50=_paired(runs, d_by_round, "ttfts_ms", 50) if paired else None,
                added_ttft_p99=_paired(runs, d_by_round, "ttfts_ms", 99) if paired else None,
                itl_p50=percentile(itl, 50),
                itl_p99=percentile(itl, 99),
                itl_p50_change=_paired(runs, d_by_round, "itls_ms", 50) if paired else None,
                itl_p99_change=_paired(runs, d_by_round, "itls_ms", 99) if paired else None,
                tokens_per_s=statistics.median(r.result.tokens_per_s for r in runs),
                share_of_direct=statistics.median(ratios) if ratios and has_ref else None,
                share_range=(min(ratios), max(ratios)) if ratios and has_ref else None,
                added_p50_range=(min(added_p50), max(added_p50)) if paired else None,
                cpu_s_per_1k_requests=_cpu(runs, 1000, "relayed_requests"),
                cpu_s_per_100k_tokens=_cpu(runs, 100_000, "relayed_tokens"),
                peak_rss_mib=max(rss) if rss else None,
            )
        )
    return out


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None or math.isnan(v) else format(v, fmt)


HEADER = (
    "| load | path | added TTFT p50 / p99 (ms) | ITL p50 / p99 change (ms) | tok/s "
    "| share of direct | relay CPU s / 1k req | relay CPU s / 100k tok | peak RSS MiB |"
)


def markdown(all_rows: list[Row]) -> str:
    lines = [HEADER, "|---|---|---|---|---|---|---|---|---|"]
    for r in all_rows:
        if r.target == DIRECT:
            added = f"(TTFT {r.ttft_p50:.1f} / {r.ttft_p99:.1f})"
            itl = f"(ITL {r.itl_p50:.2f} / {r.itl_p99:.2f})"
        else:
            added = f"{_f(r.added_ttft_p50, '+.2f')} / {_f(r.added_ttft_p99, '+.2f')}"
            itl = f"{_f(r.itl_p50_change, '+.2f')} / {_f(r.itl_p99_change, '+.2f')}"
        share = "-" if r.share_of_direct is None else f"{r.share_of_direct:.1%}"
        if r.share_range is not None and len(set(r.share_range)) > 1:
            share += f" ({r.share_range[0]:.0%}-{r.share_range[1]:.0%})"
        lines.append(
            f"| {r.level} | {r.target} | {added} | {itl} | {r.tokens_per_s:,.0f} | {share} "
            f"| {_f(r.cpu_s_per_1k_requests, '.2f')} | {_f(r.cpu_s_per_100k_tokens, '.2f')} "
            f"| {_f(r.peak_rss_mib, '.0f')} |"
        )
    return "\n".join(lines)


EXPORTER_NAMES = {
    "sidecar-events": "events (JSONL)",
    "sidecar-spans": "spans (OTLP/HTTP)",
    "sidecar-metrics": "metrics scrape (recording is in the bare sidecar)",
}


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def exporter_costs(all_rows: list[Row], base: str = "sidecar-bare") -> str:
    """What each exporter adds over the bare sidecar, per load level (empty if not measured)."""
    lines = []
    for level in dict.fromkeys(r.level for r in all_rows):
        at = {r.target: r for r in all_rows if r.level == level}
        if base not in at or at[base].cpu_s_per_1k_requests is None:
            continue
        b = at[base]
        for name, r in at.items():
            if not name.startswith("sidecar-") or name == base:
                continue
            if r.cpu_s_per_1k_requests is None or r.cpu_s_per_100k_tokens is None:
                continue
            assert b.cpu_s_per_1k_requests is not None and b.cpu_s_per_100k_tokens is not None
            d_req = r.cpu_s_per_1k_requests - b.cpu_s_per_1k_requests
            d_tok = r.cpu_s_per_100k_tokens - b.cpu_s_per_100k_tokens
            ttft = (
                _diff(r.added_ttft_p50, b.added_ttft_p50),
                _diff(r.added_ttft_p99, b.added_ttft_p99),
            )
            lines.append(
                f"| {level} | {EXPORTER_NAMES.get(name, name)} | {d_req:+.2f} | {d_tok:+.2f} "
                f"| {_f(ttft[0], '+.2f')} / {_f(ttft[1], '+.2f')} |"
            )
    if not lines:
        return ""
    head = (
        f"| load | exporter (over {base}) | CPU s / 1k req | CPU s / 100k tok "
        "| TTFT p50 / p99 change (ms) |\n|---|---|---|---|---|"
    )
    return head + "\n" + "\n".join(lines)


def cost_split(all_rows: list[Row], short: str = "short", long: str = "long") -> str:
    """Each relay's CPU as a cost per request plus a cost per token, from the same targets
    at two output lengths (``short``, ``long``): per token, the CPU difference between
    them over the token difference; per request, what the short run leaves (empty if
    either level did not run)."""
    at = {(r.level, r.target): r for r in all_rows}
    lines = []
    fits: dict[str, tuple[float, float]] = {}
    for r in all_rows:
        if r.level != short or (long, r.target) not in at:
            continue
        fit = split_fit(r, at[long, r.target])
        if fit is not None:
            fits[r.target] = fit
    if not fits:
        return ""
    ref = fits.get("nginx")
    for target, (per_req_s, per_tok_s) in fits.items():
        vs = f"{per_tok_s / ref[1]:.2f}x" if ref and ref[1] > 0 else "-"
        vs_req = f"{per_req_s / ref[0]:.1f}x" if ref and ref[0] > 0 else "-"
        lines.append(
            f"| {target} | {per_req_s * 1e3:.3f} | {vs_req} | {per_tok_s * 1e6:.1f} | {vs} |"
        )
    head = (
        "| relay | CPU ms per request | vs nginx | CPU µs per token | vs nginx |\n"
        "|---|---|---|---|---|"
    )
    return head + "\n" + "\n".join(lines)


def split_fit(short: Row, long: Row) -> tuple[float, float] | None:
    """(CPU s per request, CPU s per token) through the two rows' (tokens, CPU) per request."""
    points = []
    for r in (short, long):
        if not r.cpu_s_per_1k_requests or not r.cpu_s_per_100k_tokens:
            return None
        cpu = r.cpu_s_per_1k_requests / 1000  # per request
        tokens = cpu / (r.cpu_s_per_100k_tokens / 100_000)  # tokens per request
        points.append((tokens, cpu))
    (t0, c0), (t1, c1) = points
    if t1 <= t0:
        return None
    per_token = (c1 - c0) / (t1 - t0)
    return c0 - per_token * t0, per_token
