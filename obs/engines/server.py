"""Start and stop a real ``vllm serve`` on 127.0.0.1, by process group.

The server runs through ``obs.procs.ManagedProcess``: in its own session
(process group), so stopping it also reaches the engine-core processes vLLM spawns,
and a Ctrl-C in the caller's terminal does not hit vLLM directly.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from obs.engines.setup import (
    EngineError,
    engine_environment,
    engine_home,
    engine_python,
    launcher_path,
)
from obs.procs import (
    HOST,
    LOG_TAIL_LINES,
    ManagedProcess,
    NotReady,
    free_port,
    http_status,
    port_in_use,
    signal_group,
)

DEFAULT_STARTUP_TIMEOUT_S = 180.0
DEFAULT_STOP_TIMEOUT_S = 15.0

# Flags every server gets: loopback only, fast start (no torch.compile), and the prefix
# cache with cached-token counts in responses.
_FIXED_FLAGS = (
    "--host",
    HOST,
    "--enforce-eager",
    "--enable-prefix-caching",
    "--enable-prompt-tokens-details",
)


# vLLM's CPU platform runs the model in a worker process of its own (the ``mp`` executor): a
# third interpreter, spawned after the API server and the engine core, that imports torch and
# vLLM once more and is pinned to core 0. With ``--distributed-executor-backend uni`` and this
# variable off (vLLM keeps ``uni`` on CPU only then) the engine core runs the model itself, as
# vLLM does by default for one GPU; ``vllm serve`` still runs its engine core in a process of
# its own. Ready in 16.9 s twice against 24.1 and 37.6 s on this project's 2-core machine
# (``VllmServer(in_process_model=True)``: the soak's replicas, which restart under load, and the
# restart test's). It changes what the engine does under load, so the demo's and the sweep's
# pools keep the worker process: their API server falls behind the engine more often and merges
# several tokens into one stream frame (vLLM's output collector does when its reader is
# behind), so two identical greedy streams may be framed differently (the tests comparing
# streams byte for byte failed 4 times in 8); and the short demo, which drives load at a share
# of the capacity it probes, sent 10 requests in its 5 s, none of two of its six classes.
IN_PROCESS_MODEL_FLAGS = ("--distributed-executor-backend", "uni")
IN_PROCESS_MODEL_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}

# vLLM's cache of its model-class inspection, under VLLM_CACHE_ROOT (see ``cache_root``).
MODELINFOS = "modelinfos"


def cache_root(scratch: Path, home: Path) -> Path:
    """A start's ``VLLM_CACHE_ROOT``: its own, under ``scratch``, removed with it, but with
    vLLM's model-inspection cache (``modelinfos``) linked to one under the engine ``home``.

    Without that cache vLLM inspects the model's class in a fresh interpreter, torch imported
    once more: measured 25.5 s a start with a fresh root against 18.7 s with the cache, on
    this project's 2-core machine. Its files are keyed by the hash of vLLM's model module and
    written atomically (a new vLLM writes new ones); nothing else is shared between starts.
    A home that cannot hold it leaves vLLM inspecting the model itself, as before.
    """
    root = scratch / "vllm-cache"
    root.mkdir(parents=True, exist_ok=True)
    shared = home / "vllm-cache" / MODELINFOS
    try:
        shared.mkdir(parents=True, exist_ok=True)
        if os.access(shared, os.W_OK | os.X_OK):
            (root / MODELINFOS).symlink_to(shared, target_is_directory=True)
    except OSError:
        pass
    return root


class ServerError(EngineError):
    """The vLLM server could not be started or controlled."""


class VllmServer:
    """A ``vllm serve`` process for one model, reachable at :attr:`url`.

    Use as a context manager (``with VllmServer(dir) as server: ...``) or call
    :meth:`start` / :meth:`stop`. The engine runs with ``--enforce-eager``: ready in
    20-30 s on an idle 2-core machine, instead of ~40 s with torch.compile; about 17 s with
    ``in_process_model`` (the model run in the engine core: ``IN_PROCESS_MODEL_FLAGS``, which
    changes how streams are framed under load). ``env`` adds variables to this server's environment
    only (e.g. ``OTEL_BSP_SCHEDULE_DELAY``).
    """

    LABEL = "vllm serve"

    def __init__(
        self,
        model_dir: Path,
        *,
        port: int | None = None,
        served_model_name: str = "tiny",
        max_model_len: int = 2048,
        kv_cache_bytes: int | None = None,
        otlp_traces_endpoint: str | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        python: Path | None = None,
        launcher: Path | None = None,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
        in_process_model: bool = False,
    ) -> None:
        if max_model_len <= 0:
            raise ValueError(f"max_model_len must be positive, got {max_model_len}")
        if kv_cache_bytes is not None and kv_cache_bytes <= 0:
            raise ValueError(f"kv_cache_bytes must be positive, got {kv_cache_bytes}")
        self._model_dir = Path(model_dir)
        self._port = free_port() if port is None else port
        self._served_model_name = served_model_name
        self._max_model_len = max_model_len
        self._kv_cache_bytes = kv_cache_bytes
        self._otlp_traces_endpoint = otlp_traces_endpoint
        self._extra_args = tuple(extra_args)
        self._env = dict(env or {})
        self._requested_log_path = log_path
        self._python = engine_python(engine_home()) if python is None else python
        self._launcher = launcher_path() if launcher is None else launcher
        self._startup_timeout_s = startup_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._in_process_model = in_process_model  # IN_PROCESS_MODEL_FLAGS

        self._process: ManagedProcess | None = None
        self._log_path: Path | None = None
        self._scratch: Path | None = None
        self._startup_s: float | None = None

    # --- properties -------------------------------------------------------------

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8000`` (OpenAI API under ``/v1``)."""
        return f"http://{HOST}:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    @property
    def served_model_name(self) -> str:
        return self._served_model_name

    @property
    def pid(self) -> int:
        """PID of the ``vllm serve`` process (also its process-group id)."""
        return self._require_process().pid

    @property
    def log_path(self) -> Path | None:
        """Combined stdout/stderr of the server; None before :meth:`start`.

        Without a ``log_path`` argument the log lives in a scratch directory that
        :meth:`stop` deletes.
        """
        return self._log_path

    @property
    def startup_seconds(self) -> float | None:
        """Seconds from launch until ``/health`` answered 200; None until then."""
        return self._startup_s

    def command(self) -> list[str]:
        """The command line :meth:`start` runs."""
        cmd = [
            str(self._python),
            str(self._launcher),
            "serve",
            str(self._model_dir),
            "--port",
            str(self._port),
            *_FIXED_FLAGS,
            "--served-model-name",
            self._served_model_name,
            "--max-model-len",
            str(self._max_model_len),
        ]
        if self._kv_cache_bytes is not None:
            cmd += ["--kv-cache-memory-bytes", str(self._kv_cache_bytes)]
        if self._otlp_traces_endpoint is not None:
            cmd += ["--otlp-traces-endpoint", self._otlp_traces_endpoint]
        if self._in_process_model:
            cmd += IN_PROCESS_MODEL_FLAGS
        return cmd + list(self._extra_args)

    # --- lifecycle --------------------------------------------------------------

    def start(self) -> VllmServer:
        """Launch the server and wait until ``GET /health`` answers 200.

        Raises :class:`ServerError` (with the log tail) if the process exits or is
        not healthy within the startup timeout; the process group is killed then.
        """
        if self._process is not None and self._process.poll() is None:
            raise ServerError(f"server already running (pid {self._process.pid})")
        self._cleanup()  # a previous run that exited by itself
        self._process = None
        self._startup_s = None
        self._check_ready()
        if port_in_use(self._port):
            raise ServerError(f"port {self._port} on {HOST} is already in use")

        self._scratch = Path(tempfile.mkdtemp(prefix="vllm-obs-server-"))
        self._log_path = self._requested_log_path or self._scratch / "vllm.log"
        process = ManagedProcess(
            self.LABEL,
            self.command(),
            log_path=self._log_path,
            env=self._environment(cache_root(self._scratch, engine_home())),
        )
        try:
            process.start()
        except OSError as exc:
            self._cleanup()
            raise ServerError(f"cannot launch {self._python}: {exc}") from exc
        self._process = process
        health = f"{self.url}/health"
        try:
            self._startup_s = process.wait_ready(
                lambda: http_status(health) == 200, self._startup_timeout_s, f"{health} was healthy"
            )
        except NotReady as exc:
            self.kill()
            raise ServerError(str(exc)) from None
        except BaseException:
            self.kill()
            raise
        return self

    def stop(self) -> int | None:
        """SIGTERM the server, wait up to the stop timeout, then SIGKILL its process group.

        The API server shuts its engine processes down itself, so SIGTERM goes to it
        first (signalling the whole group at once kills the engine under it and logs an
        EngineDeadError); what is left of the group afterwards gets SIGTERM, then
        SIGKILL at the deadline. Returns the server's exit status (None if it was never
        started). Safe to call twice.
        """
        process = self._process
        if process is None:
            return None
        status = process.stop(self._stop_timeout_s)
        self._cleanup()
        return status

    def kill(self) -> int | None:
        """SIGKILL the whole process group at once (a crash, for fault tests)."""
        process = self._process
        if process is None:
            return None
        status = process.kill()
        self._cleanup()
        return status

    def pause(self) -> None:
        """SIGSTOP the process group: connections hang, nothing answers."""
        self._require_process()
        self._signal_group(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT the process group after :meth:`pause`."""
        self._require_process()
        self._signal_group(signal.SIGCONT)

    def poll(self) -> int | None:
        """Exit status if the server process has exited, else None."""
        return self._require_process().poll()

    def wait(self, timeout: float | None = None) -> int:
        """Block until the server process exits; raises TimeoutExpired on timeout."""
        popen = self._require_process().popen
        assert popen is not None
        return popen.wait(timeout)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server log ('' if there is none)."""
        return "" if self._process is None else self._process.log_tail(lines)

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "not started" if self._process is None else f"pid {self._process.pid}"
        return f"{type(self).__name__}({str(self._model_dir)!r}, url={self.url!r}, {state})"

    # --- internals --------------------------------------------------------------

    def _check_ready(self) -> None:
        """Raise :class:`ServerError` unless the engine and the model are installed."""
        if not self._python.exists():
            raise ServerError(
                f"engine python {self._python} not found; run `vllm-obs engine setup` first"
            )
        if not (self._model_dir / "config.json").exists():
            raise ServerError(f"no model at {self._model_dir} (config.json missing)")

    def _environment(self, cache_root: Path) -> dict[str, str]:
        env = engine_environment(os.environ)
        no_proxy = ",".join(p for p in (env.get("no_proxy", ""), HOST, "localhost") if p)
        env.update(
            {
                # Otherwise vLLM's message queue binds the host's external address.
                "VLLM_HOST_IP": HOST,
                "VLLM_CACHE_ROOT": str(cache_root),
                "HF_HUB_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
                "no_proxy": no_proxy,
                "NO_PROXY": no_proxy,
            }
        )
        if self._in_process_model:
            env.update(IN_PROCESS_MODEL_ENV)
        env.update(self._env)
        if self._kv_cache_bytes is None:
            env["VLLM_CPU_KVCACHE_SPACE"] = "1"  # GiB; it would override --kv-cache-memory-bytes
        else:
            env.pop("VLLM_CPU_KVCACHE_SPACE", None)
        return env

    def _signal_group(self, sig: signal.Signals) -> None:
        signal_group(self._require_process().pid, sig)

    def _require_process(self) -> ManagedProcess:
        if self._process is None:
            raise ServerError("server not started")
        return self._process

    def _cleanup(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)  # the cache, and the default log
            self._scratch = None
