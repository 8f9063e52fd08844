"""``vllm-obs load`` (run a load) and ``vllm-obs load check`` (join records with events).

Argparse-level code only at import time; the handlers import the driver
(aiohttp) and turn the namespace into typed options at once.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from obs.errors import ConfigError

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_DURATION_S = 60.0
DEFAULT_RATE = 1.0
DEFAULT_CHECK_WAIT_S = 10.0


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """Everything ``vllm-obs load`` was asked to do, parsed once."""

    url: str
    model: str | None
    mix_path: Path | None
    sets: tuple[str, ...]
    rate: float | None
    concurrency: int | None
    burst: tuple[float, float, float] | None
    duration_s: float | None
    max_requests: int | None
    seed: int
    run_id: str
    tokenizer: Path | None
    out: Path
    timeout_s: float
    max_inflight: int
    api_key: str | None
    check_events: Path | None
    check_wait_s: float
    dry_run: bool
    progress: bool
    class_header: bool = True
    clients: int = 0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``load`` (and ``load check``) on the top-level subparsers."""
    p = subparsers.add_parser(
        "load",
        usage=(
            "vllm-obs load [options]\n       vllm-obs load check RECORDS EVENTS [--wait S] [--json]"
        ),
        help="drive mixed traffic of the six request classes and record what the client saw",
        description=(
            "Send a seeded mix of chat, rag, long-prefill, agent, batch and slow-stream requests "
            "to an OpenAI-compatible server (the sidecar or vLLM), one JSONL record per request, "
            "and print a summary per class. 'vllm-obs load check RECORDS EVENTS' joins the "
            "records with the sidecar's events."
        ),
    )
    p.add_argument("--url", default=DEFAULT_URL, help=f"server base URL (default {DEFAULT_URL})")
    p.add_argument("--model", help="model name (default: the first GET /v1/models lists)")
    p.add_argument("--mix", type=Path, metavar="FILE", help="mix YAML laid over the default mix")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="CLASS.FIELD=VALUE",
        help="override one mix field, e.g. chat.weight=5 or rag.max_tokens=[16,32] (repeatable)",
    )
    loop = p.add_mutually_exclusive_group()
    loop.add_argument(
        "--rate",
        type=float,
        metavar="PER_S",
        help=f"open loop: Poisson arrivals per second (default {DEFAULT_RATE}); "
        "an agent conversation is one arrival",
    )
    loop.add_argument(
        "--concurrency", type=int, metavar="N", help="closed loop: this many sessions at a time"
    )
    p.add_argument(
        "--burst",
        metavar="EVERY:LENGTH:FACTOR",
        help="open loop: every EVERY s, LENGTH s at FACTOR x the rate (e.g. 60:10:5)",
    )
    p.add_argument(
        "--duration",
        type=float,
        metavar="S",
        help=f"start no request after S seconds (default {DEFAULT_DURATION_S:g} "
        "when --requests is not given either)",
    )
    p.add_argument("--requests", type=int, metavar="N", help="send at most N requests")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="plan seed (default 0)")
    p.add_argument("--run-id", metavar="ID", help="request id prefix (default lg-<random hex>)")
    p.add_argument(
        "--tokenizer",
        type=Path,
        metavar="DIR",
        help="count tokens with DIR/tokenizer.json (needs the tokenizers package); "
        "default: estimate 4 characters per token",
    )
    p.add_argument(
        "--out", type=Path, metavar="FILE", help="records file (default load-<run id>.jsonl)"
    )
    p.add_argument(
        "--timeout", type=float, default=600.0, metavar="S", help="per request, s (default 600)"
    )
    p.add_argument(
        "--max-inflight",
        type=int,
        default=1000,
        metavar="N",
        help="cap on requests in flight (default 1000)",
    )
    p.add_argument(
        "--api-key-env",
        default="OPENAI_API_KEY",
        metavar="VAR",
        help="environment variable holding a bearer token, if set (default OPENAI_API_KEY)",
    )
    p.add_argument(
        "--check",
        type=Path,
        metavar="EVENTS.jsonl",
        help="after the run, join the records with these sidecar events (exit 1 if any missing)",
    )
    p.add_argument(
        "--check-wait",
        type=float,
        default=DEFAULT_CHECK_WAIT_S,
        metavar="S",
        help=f"wait up to S for late events (default {DEFAULT_CHECK_WAIT_S:g})",
    )
    p.add_argument(
        "--no-class-header",
        action="store_true",
        help="send no X-Client-Class header: the sidecar must recognise each class from the "
        "request and the client's behaviour (with --clients; docs/lanes.md)",
    )
    p.add_argument(
        "--clients",
        type=int,
        default=0,
        metavar="N",
        help="send each class's sessions as N simulated clients, each with its own API key "
        "(without --api-key) and one request at a time; 'load check' then splits each "
        "slow-stream client's first request apart (default 0: one identity)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the plan as JSONL; send nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(handler=_run)

    sub = p.add_subparsers(
        dest="load_command", title="subcommands", metavar="check", required=False
    )
    c = sub.add_parser(
        "check",
        help="join load records with sidecar events by request_id",
        description=(
            "Join a load run's records with the sidecar's events by request_id: requests "
            "missing from either side, TTFT, end-to-end and token count differences. "
            "Exits 1 when requests are missing."
        ),
    )
    c.add_argument("records", type=Path, help="records JSONL written by vllm-obs load")
    c.add_argument("events", type=Path, help="events JSONL written by the sidecar")
    c.add_argument("--wait", type=float, default=0.0, metavar="S", help="wait for late events")
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    c.set_defaults(handler=_check)


def _burst(text: str | None) -> tuple[float, float, float] | None:
    if text is None:
        return None
    try:
        every, length, factor = (float(x) for x in text.split(":"))
    except ValueError as e:
        raise ConfigError(f"--burst {text!r}: expected EVERY:LENGTH:FACTOR, e.g. 60:10:5") from e
    return every, length, factor


def options(args: argparse.Namespace) -> LoadOptions:
    """Typed options from the parsed command line (errors name the flag)."""
    if args.rate is not None and args.rate <= 0:
        raise ConfigError(f"--rate must be positive, got {args.rate}")
    if args.concurrency is not None and args.concurrency < 1:
        raise ConfigError(f"--concurrency must be >= 1, got {args.concurrency}")
    if args.requests is not None and args.requests < 1:
        raise ConfigError(f"--requests must be >= 1, got {args.requests}")
    if args.duration is not None and args.duration <= 0:
        raise ConfigError(f"--duration must be positive, got {args.duration}")
    if args.max_inflight < 1:
        raise ConfigError(f"--max-inflight must be >= 1, got {args.max_inflight}")
    if args.clients < 0:
        raise ConfigError(f"--clients must be >= 0, got {args.clients}")
    if args.timeout <= 0:
        raise ConfigError(f"--timeout must be positive, got {args.timeout}")
    duration = args.duration
    if duration is None and args.requests is None:
        duration = DEFAULT_DURATION_S
    rate = None if args.concurrency else args.rate or DEFAULT_RATE
    run_id = args.run_id or f"lg-{secrets.token_hex(4)}"
    return LoadOptions(
        url=args.url,
        model=args.model,
        mix_path=args.mix,
        sets=tuple(args.set),
        rate=rate,
        concurrency=args.concurrency,
        burst=_burst(args.burst),
        duration_s=duration,
        max_requests=args.requests,
        seed=args.seed,
        run_id=run_id,
        tokenizer=args.tokenizer,
        out=args.out or Path(f"load-{run_id}.jsonl"),
        timeout_s=args.timeout,
        max_inflight=args.max_inflight,
        api_key=os.environ.get(args.api_key_env) or None,
        check_events=args.check,
        check_wait_s=args.check_wait,
        dry_run=args.dry_run,
        progress=not args.no_progress and sys.stderr.isatty(),
        class_header=not args.no_class_header,
        clients=args.clients,
    )


def _run(args: argparse.Namespace) -> int:
    return run(options(args))


def run(opts: LoadOptions) -> int:
    """Run ``vllm-obs load``; returns the exit status."""
    from obs.loadgen.runner import run_command

    return run_command(opts)


def _check(args: argparse.Namespace) -> int:
    import orjson

    from obs.loadgen.check import check_files

    report = check_files(args.records, args.events, wait_s=args.wait)
    if args.json:
        sys.stdout.write(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(report.render())
    return 0 if report.ok else 1
