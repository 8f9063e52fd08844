"""Issue 45's relay bar: the sidecar against vLLM's Rust router and direct, under ``vllm bench
serve``, for each fake pool and each time to first token, every comparison inside one run.

For each pool of ``--pools`` (``bench/fake_vllm.py``, vLLM's exact bytes; ``bench/fake_openai.py``,
a second pool written apart from it: aiohttp, spaced JSON) and each ``--ttft-ms``, one
``bench.relay`` session (the same servers, warm-up, idle baseline and order of targets)
runs four loads against direct, the sidecar (every exporter on) and ``vllm-router``:

  c1     one stream, 32-128 tokens: the added TTFT p50 against the same round's direct run
  c64    64 streams, 32-128 tokens: tokens/s as a share of direct's
  short  64 streams, 2 tokens: the relay's CPU per short request
  long   64 streams, 160 tokens: with short, the CPU per token (``report.cost_split``)

and judges the bar against the router measured in the same rounds (no timed assertion; the
verdicts are printed and written, never raised):

  CPU per short request <= 1.3x the router's; CPU per token <= the router's;
  c1 added TTFT p50 <= the router's; c64 throughput >= 99% of direct's.

    flock /tmp/w/heavy.lock .venv/bin/python -m bench.relay_bar --pools fake_vllm --ttft-ms 0

Each session writes ``--out-dir/POOL-ttftT.json`` (the rows, the bar); a summary over the
sessions of this invocation is printed. ``--extra-sidecar NAME=PATH`` adds another
checkout's sidecar (before/after a change) to the same rounds, judged like the sidecar.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import relay, report
from bench.procs import FAKE_POOLS
from bench.vllm_bench import Workload
from obs.engines.setup import ensure_engine

ROUTER = "vllm-router"
LEVELS = (
    Workload("c1", concurrency=1, prompts=60),
    Workload("c64", concurrency=64, prompts=1200),
    Workload("short", concurrency=64, prompts=1200, output_len=2, output_range=0.0),
    Workload("long", concurrency=64, prompts=400, output_len=160, output_range=0.0),
)
REQUEST_RATIO = 1.3  # CPU per short request: at most this times the router's
SHARE = 0.99  # c64 tokens/s: at least this share of direct's


@dataclass
class Figures:
    """One relay's four bar figures in one session (None: not measured)."""

    short_ms_per_request: float | None  # CPU of the short run over its requests
    request_ms: float | None  # the split's cost per request (short vs long)
    token_us: float | None  # the split's cost per token
    c64_us_per_token: float | None  # CPU over tokens at c64 (requests included)
    c1_added_ttft_ms: float | None
    c64_share: float | None


def figures(rows: list[report.Row]) -> dict[str, Figures]:
    """Each relay target's figures from one session's rows."""
    at = {(r.level, r.target): r for r in rows}
    out = {}
    for target in dict.fromkeys(r.target for r in rows):
        if target == report.DIRECT:
            continue
        short, long_, c1, c64 = (at.get((lv, target)) for lv in ("short", "long", "c1", "c64"))
        fit = report.split_fit(short, long_) if short and long_ else None
        out[target] = Figures(
            short_ms_per_request=short.cpu_s_per_1k_requests if short else None,
            request_ms=fit[0] * 1e3 if fit else None,
            token_us=fit[1] * 1e6 if fit else None,
            c64_us_per_token=(
                c64.cpu_s_per_100k_tokens * 10 if c64 and c64.cpu_s_per_100k_tokens else None
            ),
            c1_added_ttft_ms=c1.added_ttft_p50 if c1 else None,
            c64_share=c64.share_of_direct if c64 else None,
        )
    return out


def verdicts(f: Figures, router: Figures | None) -> dict[str, bool | None]:
    """The bar for one relay against the router of the same session (None: not measured)."""

    def le(a: float | None, b: float | None, k: float = 1.0) -> bool | None:
        return None if a is None or b is None else a <= b * k

    r = router or Figures(None, None, None, None, None, None)
    return {
        "cpu_per_short_request": le(f.short_ms_per_request, r.short_ms_per_request, REQUEST_RATIO),
        "cpu_per_token": le(f.token_us, r.token_us),
        "c1_added_ttft": le(f.c1_added_ttft_ms, r.c1_added_ttft_ms),
        "c64_share": None if f.c64_share is None else f.c64_share >= SHARE,
    }


def _n(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"


def _mark(v: bool | None) -> str:
    return {True: "met", False: "NOT met", None: "-"}[v]


def table(sessions: dict[str, dict[str, Figures]]) -> str:
    """One line per session and relay: the four figures, the router's ratio and the verdicts."""
    head = (
        "| pool, TTFT | relay | CPU ms / short req (vs router) | split: ms / req, µs / token "
        "(token vs router) | c64 µs / token | c1 added TTFT p50 ms | c64 share of direct "
        "| bar: req / token / c1 / c64 |\n|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for session, figs in sessions.items():
        router = figs.get(ROUTER)
        for target, f in figs.items():
            v = verdicts(f, router) if target != ROUTER else {}
            rr = router.short_ms_per_request if router else None
            rt = router.token_us if router else None
            marks = " / ".join(_mark(x) for x in v.values()) if v else "(reference)"
            lines.append(
                f"| {session} | {target} | {_n(f.short_ms_per_request, '.3f')} "
                f"({_ratio(f.short_ms_per_request, rr)}) | {_n(f.request_ms, '.3f')}, "
                f"{_n(f.token_us, '.1f')} ({_ratio(f.token_us, rt)}) "
                f"| {_n(f.c64_us_per_token, '.1f')} | {_n(f.c1_added_ttft_ms, '+.2f')} "
                f"| {_n(f.c64_share, '.1%')} | {marks} |"
            )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.relay_bar",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--pools", default=",".join(FAKE_POOLS), help="comma-separated fake pools")
    ap.add_argument("--ttft-ms", default="0,20", help="comma-separated times to first token")
    ap.add_argument("--targets", default=f"direct,sidecar,{ROUTER}")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds per session")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every level's requests")
    ap.add_argument(
        "--levels",
        default=",".join(w.name for w in LEVELS),
        help="comma-separated subset of the levels (a bar figure needs its levels)",
    )
    ap.add_argument("--extra-sidecar", action="append", default=[], metavar="NAME=PYTHONPATH")
    ap.add_argument("--out-dir", type=Path, default=Path("bench/results/relay-bar"))
    ap.add_argument(
        "--summary", action="store_true", help="run nothing: the bar table of --out-dir's sessions"
    )
    args = ap.parse_args(argv)
    args.pool_names = [p for p in args.pools.split(",") if p]
    if bad := [p for p in args.pool_names if p not in FAKE_POOLS]:
        ap.error(f"unknown pool(s) {bad}; choose from {sorted(FAKE_POOLS)}")
    try:
        args.ttfts = [float(t) for t in args.ttft_ms.split(",") if t]
    except ValueError:
        ap.error(f"--ttft-ms takes comma-separated numbers, got {args.ttft_ms!r}")
    if args.scale <= 0:
        ap.error("--scale must be positive")
    known = [w.name for w in LEVELS]
    args.level_names = [lv for lv in args.levels.split(",") if lv]
    if bad := [lv for lv in args.level_names if lv not in known]:
        ap.error(f"unknown level(s) {bad}; choose from {known}")
    return args


def session(args: argparse.Namespace, pool: str, ttft: float) -> dict[str, object]:
    """One bench.relay session: every level on every target, interleaved; its rows and bar."""
    argv = ["--targets", args.targets, "--pool", pool, "--ttft-ms", str(ttft)]
    argv += ["--rounds", str(args.rounds)]
    for spec in args.extra_sidecar:
        argv += ["--extra-sidecar", spec]
    rargs = relay.parse_args(argv)
    levels = [
        Workload(**{**asdict(w), "prompts": max(1, round(w.prompts * args.scale))})
        for w in LEVELS
        if w.name in args.level_names
    ]
    work = Path(tempfile.mkdtemp(prefix="vllm-obs-relay-bar-"))
    b = relay.Bench(rargs, work)
    try:
        b.start(rargs.target_names)
        runs, counts = relay.measure(b, rargs, levels)
    finally:
        b.stop()
        shutil.rmtree(work, ignore_errors=True)
    rows = [row for w in levels for row in report.rows(w.name, runs[w.name])]
    figs = figures(rows)
    return {
        "pool": pool,
        "ttft_ms": ttft,
        "table": report.markdown(rows),
        "cost_split": report.cost_split(rows),
        "figures": {t: asdict(f) for t, f in figs.items()},
        "bar": {t: verdicts(f, figs.get(ROUTER)) for t, f in figs.items() if t != ROUTER},
        "rows": [asdict(r) for r in rows],
        "rounds": relay.round_figures(runs),  # per run: CPU (and its kernel part), RSS, ...
        "events_written": counts,
        "failed": sum(r.failed for r in rows),
        "_figures": figs,
    }


def saved(out_dir: Path) -> dict[str, dict[str, Figures]]:
    """The figures of every session saved in ``out_dir``, by pool and TTFT."""
    docs = [json.loads(p.read_text()) for p in sorted(out_dir.glob("*.json"))]
    docs.sort(key=lambda d: (d["pool"], d["ttft_ms"]))
    return {
        f"{d['pool']}, {d['ttft_ms']:g} ms": {t: Figures(**f) for t, f in d["figures"].items()}
        for d in docs
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.summary:
        print(table(saved(args.out_dir)))
        return 0
    ensure_engine(progress=relay.progress)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, dict[str, Figures]] = {}
    failed = 0
    for pool in args.pool_names:
        for ttft in args.ttfts:
            started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            doc = session(args, pool, ttft)
            name = f"{pool}, {ttft:g} ms"
            summary[name] = doc.pop("_figures")  # type: ignore[assignment]
            failed += int(doc["failed"])  # type: ignore[call-overload]
            print(f"\n## {name}\n\n{doc['table']}\n\n{doc['cost_split']}", flush=True)
            doc["started"] = started
            doc["command"] = "python -m bench.relay_bar " + " ".join(
                sys.argv[1:] if argv is None else argv
            )
            path = args.out_dir / f"{pool}-ttft{ttft:g}.json"
            path.write_text(json.dumps(doc, indent=2) + "\n")
            relay.progress(f"results: {path}")
    print("\n" + table(summary))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
