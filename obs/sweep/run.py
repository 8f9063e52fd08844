"""``run_sweep``: each profile's pools, sidecar and the same seeded load, round by round.

For every round, every profile in turn (the order rotates each round, so drift
on a shared machine reaches every profile): start the profile's pools (real
``vllm serve``, or its ``--external`` URLs), the sidecar with the profile's
lanes, drive the same seeded mix (same arrival times, same prompts), then stop
everything by PID. A pool that does not start is reported for that profile and
the sweep goes on. Ctrl-C stops the current run cleanly; the matrix is built
from the runs that finished.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import yaml

from obs.demo import workload
from obs.demo.stack import Stack, start_servers, start_sidecar
from obs.errors import ObsError
from obs.interrupt import Interrupted, Interruptible
from obs.sweep.options import DEFAULT_KV_CACHE_MIB, LOCAL_MAX_MODEL_LEN, SweepOptions
from obs.sweep.profile import EngineFlags, Profile

if TYPE_CHECKING:
    from obs.engines.server import VllmServer
    from obs.engines.setup import EnginePaths

MIB = 1 << 20
# Pools start one profile at a time on a machine others may share: be patient.
POOL_START_TIMEOUT_S = 600.0
OK = "ok"


class SweepError(ObsError):
    """The sweep could not run at all (its output folder, the engine)."""


@dataclass(slots=True)
class RunRecord:
    """One profile in one round: what happened and where its files are."""

    profile: str
    round: int
    status: str  # ok, pool-failed, sidecar-failed, interrupted
    folder: str
    wall_s: float = 0.0  # the load, from first request to last answer
    sent: int = 0
    errors: int = 0
    pools_start_s: float | None = None
    message: str = ""


def pool_server(flags: EngineFlags, paths: EnginePaths, log_path: Path | None = None) -> VllmServer:
    """One local replica of a profile's pool: ``vllm serve`` with the pool's flags (not started)."""
    from obs.engines.server import VllmServer

    return VllmServer(
        paths.model_dir,
        max_model_len=LOCAL_MAX_MODEL_LEN,
        kv_cache_bytes=(flags.kv_cache_mib or DEFAULT_KV_CACHE_MIB) * MIB,
        extra_args=flags.vllm_args(),
        log_path=log_path,
        python=paths.python,
        launcher=paths.launcher,
        startup_timeout_s=POOL_START_TIMEOUT_S,
    )


def run_sweep(
    opts: SweepOptions, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """Run the sweep and write the matrix; returns the exit status."""
    return Sweep(opts, stdout or sys.stdout, stderr or sys.stderr).run()


class Sweep:
    def __init__(self, opts: SweepOptions, stdout: TextIO, stderr: TextIO) -> None:
        self.opts = opts
        self.out = opts.out.expanduser().resolve()
        self.stdout = stdout
        self.stderr = stderr
        self.started = time.monotonic()
        self.run_id = f"sweep-{secrets.token_hex(3)}"
        self.runs: list[RunRecord] = []
        self.stack: Stack | None = None
        self.tracked: list[dict[str, Any]] = []
        self.stop_after_run = False
        self.signals = Interruptible(
            lambda: self.say(
                "[sweep] still stopping the processes of the current run; a moment ..."
            )
        )

    def say(self, msg: str) -> None:
        print(msg, file=self.stderr, flush=True)

    # --- the sweep ----------------------------------------------------------------

    def run(self) -> int:
        interrupted: int | None = None
        with self.signals:
            try:
                self._run_all()
            except Interrupted as e:
                self.say(f"\n[sweep] {e}: stopping the current run; keeping the runs that finished")
                interrupted = e.signum
            finally:
                self.signals.stopping()
                self._stop_current()
        self._write_runs()
        status = self._results()
        return 128 + interrupted if interrupted is not None else status

    def _run_all(self) -> None:
        opts = self.opts
        if self.out.exists() and not self.out.is_dir():
            raise SweepError(f"--out {self.out}: exists and is not a directory")
        self.out.mkdir(parents=True, exist_ok=True)
        self.say(f"[sweep] output folder: {self.out}")
        paths = None if opts.external or opts.engine == "sim" else self._setup_engine()
        mix_path = self._write_mix()
        mix = workload.load_demo_mix(mix_path, opts.mix_sets)
        names = [p.name for p in opts.profiles]
        total = opts.rounds * len(opts.profiles)
        self.say(
            f"[sweep] {len(names)} profiles x {opts.rounds} rounds = {total} runs: "
            f"{', '.join(names)}; each run: {opts.rate:g} sessions/s for {opts.duration_s:g} s"
            + (f" (at most {opts.sessions} sessions)" if opts.sessions else "")
            + f", seed {opts.seed}"
        )
        done = 0
        for rnd in range(1, opts.rounds + 1):
            shift = (rnd - 1) % len(opts.profiles)
            order = [*opts.profiles[shift:], *opts.profiles[:shift]]
            for profile in order:
                done += 1
                elapsed = time.monotonic() - self.started
                self.say(
                    f"\n[sweep] run {done}/{total}: round {rnd}/{opts.rounds}, profile "
                    f"{profile.name} ({elapsed:.0f} s elapsed, "
                    f"{sum(r.sent for r in self.runs)} requests done)"
                )
                record = self._one(profile, rnd, mix, paths)
                self.runs.append(record)
                self.say(f"[sweep] {profile.name} round {rnd}: {self._describe(record)}")
                if self.stop_after_run:
                    return

    def _describe(self, r: RunRecord) -> str:
        if r.status in (OK, "interrupted"):
            return f"{r.status}: {r.sent} requests, {r.errors} errors, load {r.wall_s:.1f} s"
        return f"{r.status}: {r.message.splitlines()[0] if r.message else ''}"

    def _setup_engine(self) -> Any:
        from obs.engines.setup import ensure_engine

        t = time.monotonic()
        paths = ensure_engine(progress=lambda m: self.say(f"[setup]   {m}"))
        self.say(f"[setup] engine ready in {time.monotonic() - t:.1f} s")
        return paths

    def _write_mix(self) -> Path | None:
        if self.opts.mix is not None:
            return self.opts.mix
        # Simulated GPU pools take the full six-class mix (8k-token prompts); the tiny
        # CPU model, the demo mix cut to its 2048-token context.
        full = self.opts.engine == "sim"
        return workload.write_mix(self.out / "mix.yaml", full_mix=full)

    # --- one profile, one round ------------------------------------------------------

    def _one(self, profile: Profile, rnd: int, mix: Any, paths: Any) -> RunRecord:
        folder = self.out / "runs" / profile.name / f"round-{rnd}"
        (folder / "logs").mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*.jsonl"):
            old.unlink()
        record = RunRecord(profile.name, rnd, OK, str(folder.relative_to(self.out)))
        self.stack = Stack(self.say)
        try:
            if self.opts.external:
                replicas = self._external(profile)
            elif self.opts.engine == "sim":
                started = self._sim_pools(profile, folder, record)
                if started is None:
                    return record
                replicas = started
            else:
                started = self._local_pools(profile, folder, paths, record)
                if started is None:
                    return record
                replicas = started
            config = folder / "lanes.yaml"
            header = f"# vllm-obs sweep: profile {profile.name} ({profile.source}), round {rnd}\n"
            data = profile.lanes_config(replicas, "sim" if self.opts.engine == "sim" else None)
            config.write_text(header + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
            url = self._sidecar(folder, record)
            if url is None:
                return record
            self._load(url, mix, folder, record)
        finally:
            self._stop_current()
        return record

    def _external(self, profile: Profile) -> dict[str, list[str]]:
        missing = [p.name for p in profile.config.pools if p.name not in profile.external]
        if missing:
            raise SweepError(
                f"--external: profile {profile.name!r} gives no replicas for pool(s) "
                f"{', '.join(missing)} ({profile.source})"
            )
        return profile.external

    def _local_pools(
        self, profile: Profile, folder: Path, paths: Any, record: RunRecord
    ) -> dict[str, list[str]] | None:
        servers, names = [], []
        replicas: dict[str, list[str]] = {}
        for pool, flags in profile.engines.items():
            replicas[pool] = []
            for i in range(flags.replicas):
                server = pool_server(flags, paths, folder / "logs" / f"vllm-{pool}-{i}.log")
                servers.append(server)
                names.append(f"{pool}-{i}" if flags.replicas > 1 else pool)
                replicas[pool].append(server.url)
                self.say(f"[pools] {names[-1]}: {server.url}  {flags.describe()}")
        t = time.monotonic()
        assert self.stack is not None
        errors = start_servers(servers, self.stack, names)
        self._track()
        record.pools_start_s = round(time.monotonic() - t, 1)
        if errors:
            record.status = "pool-failed"
            record.message = "\n".join(str(e) for e in errors)
            return None
        self.say(f"[pools] {len(servers)} vLLM server(s) ready in {record.pools_start_s} s")
        return replicas

    def _sim_pools(
        self, profile: Profile, folder: Path, record: RunRecord
    ) -> dict[str, list[str]] | None:
        """Start each pool's simulated replicas at GPU scale (the profile's ``gpu:`` blocks)."""
        from obs.engines.sim.process import SimServer

        assert self.stack is not None
        replicas: dict[str, list[str]] = {}
        t = time.monotonic()
        for pool, flags in profile.gpu_pools().items():
            replicas[pool] = []
            for i in range(flags.replicas):
                name = f"sim pool {pool}-{i}"
                server = SimServer(
                    flags.sim_args(), log_path=folder / "logs" / f"sim-{pool}-{i}.log"
                )
                self.stack.push(name, server.stop)
                try:
                    server.start()
                except RuntimeError as e:
                    record.status = "pool-failed"
                    record.message = str(e)
                    return None
                finally:
                    if server.process.popen is not None:
                        self.stack.track(name, server.pid, group=True)
                replicas[pool].append(server.url)
                self.say(f"[pools] {pool}-{i}: {server.url}  {flags.describe()}")
        self._track()
        record.pools_start_s = round(time.monotonic() - t, 1)
        return replicas

    def _sidecar(self, folder: Path, record: RunRecord) -> str | None:
        assert self.stack is not None
        try:
            sidecar = start_sidecar(
                self.stack,
                folder / "lanes.yaml",
                folder / "events.jsonl",
                folder / "logs" / "sidecar.log",
                env={"OTEL_TRACES_EXPORTER": "none"},
            )
        except (RuntimeError, TimeoutError) as e:
            record.status = "sidecar-failed"
            record.message = str(e)
            return None
        finally:
            self._track()
        return sidecar.url

    def _load(self, url: str, mix: Any, folder: Path, record: RunRecord) -> None:
        opts = self.opts
        view = workload.LiveView(self.stderr, opts.duration_s, in_place=opts.live_in_place)
        outcome = workload.drive(
            url,
            mix,
            duration_s=opts.duration_s,
            rate=opts.rate,
            seed=opts.seed,
            run_id=self.run_id,  # one id for the sweep: the same prompts in every run
            records=folder / "load.jsonl",
            view=view,
            notice=lambda m: self.say(f"\n[load] {m}"),
            sessions=opts.sessions,
            whole_plan=True,  # every profile gets every planned request, however busy
        )
        self.signals.arm()  # the event loop removed its own
        if outcome.aborted_by is not None:
            record.status = "interrupted"
            raise Interrupted(outcome.aborted_by)
        if outcome.stopped_early:
            record.status = "interrupted"
            self.stop_after_run = True
        result = outcome.result
        if result is not None:
            record.wall_s = round(result.wall_s, 3)
            record.sent, record.errors = result.sent, result.errors

    # --- stopping and results --------------------------------------------------------

    def _track(self) -> None:
        if self.stack is None:
            return
        known = {(t["name"], t["pid"]) for t in self.tracked}
        for t in self.stack.tracked:
            if (t.name, t.pid) not in known:
                self.tracked.append(asdict(t))

    def _stop_current(self) -> None:
        stack, self.stack = self.stack, None
        if stack is None:
            return
        for failure in stack.stop_all():
            self.say(f"[stop] {failure}")
        survivors = stack.survivors()
        if survivors:
            self.say("[stop] WARNING: still running: " + ", ".join(survivors))
        elif stack.stopped:
            self.say(f"[stop] stopped {', '.join(stack.stopped)}; none left running")

    def _write_runs(self) -> None:
        if not self.out.is_dir():
            return
        (self.out / "pids.json").write_text(json.dumps(self.tracked, indent=2) + "\n")
        data = {
            "run_id": self.run_id,
            "wall_s": round(time.monotonic() - self.started, 1),
            "runs": [asdict(r) for r in self.runs],
        }
        (self.out / "runs.json").write_text(json.dumps(data, indent=2) + "\n")

    def _results(self) -> int:
        from obs.sweep.results import write_results

        finished = [r for r in self.runs if r.status == OK]
        if not finished:
            self.say("[sweep] no run finished: no matrix")
            return 1
        with contextlib.suppress(BrokenPipeError):
            text = write_results(
                self.opts, self.out, self.runs, time.monotonic() - self.started, self.say
            )
            print(text, file=self.stdout, flush=True)
        return 0
