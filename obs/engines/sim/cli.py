"""``vllm-obs engine sim``: a simulated vLLM replica on 127.0.0.1, in the foreground."""

from __future__ import annotations

import argparse
import contextlib
import signal
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from obs.engines.sim.calibration import load_calibration
from obs.engines.sim.engine import EngineConfig, SimEngine
from obs.engines.sim.hardware import (
    CALIBRATION,
    GPUS,
    MODELS,
    Calibration,
    PerfModel,
    find_gpu,
    find_model,
    perf_model,
    with_calibration,
)
from obs.engines.sim.scheduler import SchedulerConfig
from obs.engines.sim.specs import looks_like_path
from obs.errors import ConfigError, ObsError

if TYPE_CHECKING:  # the web server is imported by the handler: `vllm-obs --help` skips it
    from aiohttp import web

    from obs.engines.sim.server import ServerConfig

DESCRIPTION = """\
Serve a simulated vLLM replica: vLLM's OpenAI routes, /metrics under vLLM's V1 names,
and a step scheduler that obeys the vLLM flags below (token budget per step, batch
size, chunked prefill, long-prefill cap, stream interval, prefix caching over a KV
cache of N blocks with preemption). Each step lasts as long as a roofline model of
the named GPU and model says (docs/sim.md). It is a model, not a measurement: its
/version says "sim-GPU-MODEL", and a pool of it is configured with `engine: sim`.
No GPU, no weights, little CPU. Stops on Ctrl-C or SIGTERM.
"""


@dataclass(frozen=True, slots=True)
class SimOptions:
    host: str
    port: int
    server: ServerConfig
    engine: EngineConfig
    memory_utilization: float
    tp: int = 1
    weights: str = "bf16"
    kv_cache_dtype: str = "auto"
    perf: PerfModel | None = None  # the resolved GPU, model and calibration


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "sim",
        help="serve a simulated vLLM replica (GPU-shaped timing, no GPU)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_hardware_flags(p)
    p.add_argument(
        "--served-model-name", metavar="NAME", help="model name in requests (default: --model)"
    )
    p.add_argument("--host", default="127.0.0.1", help="address (default %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default %(default)s)")
    p.add_argument(
        "--max-model-len", type=int, metavar="TOKENS", help="context length (default: 32768)"
    )
    p.add_argument("--max-num-batched-tokens", type=int, default=8192, metavar="N")
    p.add_argument("--max-num-seqs", type=int, default=256, metavar="N")
    p.add_argument(
        "--long-prefill-token-threshold",
        type=int,
        default=0,
        metavar="N",
        help="cap one request's prefill chunk per step (0: no cap)",
    )
    p.add_argument(
        "--enable-chunked-prefill",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="split long prefills over steps (default on, as vLLM V1)",
    )
    p.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse cached prompt blocks (default on)",
    )
    p.add_argument(
        "--stream-interval", type=int, default=1, metavar="N", help="tokens per streamed chunk"
    )
    p.add_argument("--block-size", type=int, default=16, metavar="TOKENS")
    p.add_argument(
        "--num-gpu-blocks-override",
        type=int,
        metavar="N",
        help="KV cache blocks (default: what the GPU holds after the weights)",
    )
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, metavar="SHARE")
    p.add_argument(
        "--max-num-partial-prefills",
        type=int,
        metavar="N",
        help="accepted for vLLM compatibility; not modelled",
    )
    p.add_argument(
        "--max-long-partial-prefills",
        type=int,
        metavar="N",
        help="accepted for vLLM compatibility; not modelled",
    )
    p.add_argument(
        "--default-output-tokens",
        type=int,
        default=128,
        metavar="N",
        help="reply length when a request sets no max_tokens (default %(default)s)",
    )
    p.add_argument(
        "--otlp-traces-endpoint",
        metavar="URL",
        help="send each finished request's llm_request span here, as vLLM does "
        "(OTLP/HTTP protobuf, e.g. http://127.0.0.1:4318/v1/traces)",
    )
    p.add_argument(
        "--speed",
        type=float,
        default=1.0,
        metavar="X",
        help="run the modelled clock X times faster than real time (default 1)",
    )
    p.set_defaults(handler=run)
    from obs.engines.sim import check_command

    sub = p.add_subparsers(dest="sim_command", metavar="COMMAND", required=False)
    check_command.add_parser(sub)


def add_hardware_flags(p: argparse.ArgumentParser) -> None:
    """The GPU, model, parallelism, weights, KV cache and calibration flags (engine sim and its
    check)."""
    p.add_argument(
        "--gpu",
        default="H100",
        metavar="NAME|FILE",
        help=f"one of {', '.join(GPUS)}, or a GPU spec file (YAML/JSON: bf16_tflops, "
        "fp8_tflops, memory_bandwidth_tbps, memory_gib, interconnect_gbps; docs/sim.md) "
        "(default H100)",
    )
    p.add_argument(
        "--model",
        default="llama-3.1-8b",
        help=f"one of {', '.join(MODELS)} (default %(default)s)",
    )
    p.add_argument(
        "--model-config",
        metavar="PATH",
        help="the model's Hugging Face config.json (any decoder, MoE included) instead of --model",
    )
    p.add_argument(
        "--calibration",
        metavar="FILE",
        help="a host calibration written by `engine sim check --fit` (docs/sim.md)",
    )
    p.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=int,
        default=1,
        metavar="N",
        help="GPUs the model is split over, with their all-reduces (1, 2, 4 or 8; default 1)",
    )
    p.add_argument(
        "--quantization",
        "-q",
        choices=("fp8",),
        help="fp8: FP8 weights (half the bytes, FP8 tensor cores where the GPU has them)",
    )
    p.add_argument(
        "--kv-cache-dtype",
        choices=("auto", "fp8"),
        default="auto",
        help="fp8: one byte per KV element (default auto: BF16)",
    )


def hardware(args: argparse.Namespace) -> tuple[str, str, Calibration]:
    """The GPU and model (a preset's name or a file's path) and the calibration the flags
    name; files are read here, so a bad one is an error before anything starts."""
    model = args.model if args.model_config is None else load_model_path(args.model_config)
    find_model(model)
    find_gpu(args.gpu)
    cal = CALIBRATION if args.calibration is None else load_calibration(args.calibration).cal
    return args.gpu, model, cal


def load_model_path(path: str) -> str:
    """A --model-config value as perf_model takes it (a path, never a preset's name)."""
    if not Path(path).is_file():
        raise ConfigError(f"--model-config {path}: no such file")
    return str(Path(path)) if looks_like_path(path) else f"./{path}"


def _positive(name: str, value: float | None) -> None:
    if value is not None and value <= 0:
        raise ConfigError(f"{name} must be positive, got {value}")


def options(args: argparse.Namespace) -> SimOptions:
    """The typed options; raises :class:`ConfigError` naming the bad flag."""
    for flag in (
        "max_model_len",
        "max_num_batched_tokens",
        "max_num_seqs",
        "stream_interval",
        "block_size",
        "num_gpu_blocks_override",
        "default_output_tokens",
        "speed",
    ):
        _positive("--" + flag.replace("_", "-"), getattr(args, flag))
    if args.long_prefill_token_threshold < 0:
        raise ConfigError("--long-prefill-token-threshold must be >= 0")
    if not 0 < args.gpu_memory_utilization <= 1:
        raise ConfigError("--gpu-memory-utilization must be in (0, 1]")
    if args.max_num_batched_tokens < args.max_num_seqs:
        raise ConfigError(
            f"--max-num-batched-tokens ({args.max_num_batched_tokens}) must be at least "
            f"--max-num-seqs ({args.max_num_seqs})"
        )
    weights = "fp8" if args.quantization == "fp8" else "bf16"
    gpu, model, cal = hardware(args)
    perf = perf_model(  # names checked here, with their message
        gpu, model, args.tensor_parallel_size, weights, args.kv_cache_dtype
    )
    if args.num_gpu_blocks_override is None:
        perf.kv_blocks(args.block_size, args.gpu_memory_utilization)  # fits, or says why
    engine = EngineConfig(
        scheduler=SchedulerConfig(
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_num_seqs=args.max_num_seqs,
            long_prefill_token_threshold=args.long_prefill_token_threshold,
            chunked_prefill=args.enable_chunked_prefill,
        ),
        model_name=args.served_model_name or perf.model.name,
        max_model_len=args.max_model_len or 32768,
        block_size=args.block_size,
        num_blocks=args.num_gpu_blocks_override,
        prefix_caching=args.enable_prefix_caching,
        stream_interval=args.stream_interval,
        speed=args.speed,
    )
    from obs.engines.sim.server import ServerConfig

    endpoint = args.otlp_traces_endpoint
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        raise ConfigError(
            f"--otlp-traces-endpoint {endpoint!r}: give an http:// or https:// URL "
            "(the simulator sends OTLP/HTTP protobuf)"
        )
    server = ServerConfig(
        perf.gpu.name, perf.model.name.lower(), args.default_output_tokens, endpoint
    )
    return SimOptions(
        args.host,
        args.port,
        server,
        engine,
        args.gpu_memory_utilization,
        args.tensor_parallel_size,
        weights,
        args.kv_cache_dtype,
        replace(perf, cal=cal),
    )


def build(opts: SimOptions) -> web.Application:
    """The replica's app for ``opts`` (tests run it in process)."""
    from obs.engines.sim.server import create_app

    base = opts.perf or perf_model(
        opts.server.gpu, opts.server.model, opts.tp, opts.weights, opts.kv_cache_dtype
    )
    perf = with_calibration(base, replace(base.cal, memory_utilization=opts.memory_utilization))
    return create_app(SimEngine(opts.engine, perf), opts.server)


def run(args: argparse.Namespace) -> int:
    from aiohttp import web

    opts = options(args)
    app = build(opts)
    ready = (
        f"simulated vLLM ({opts.server.gpu}, {opts.server.model}) serving "
        f"{opts.engine.model_name!r} at http://{opts.host}:{opts.port}/v1; Ctrl-C to stop"
    )
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            web.run_app(
                app,
                host=opts.host,
                port=opts.port,
                print=lambda _: print(ready, flush=True),
                handle_signals=False,
            )
    except OSError as e:
        raise ObsError(f"cannot serve on {opts.host}:{opts.port}: {e.strerror or e}") from e
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


__all__ = ["SimOptions", "add_parser", "build", "options", "run"]
