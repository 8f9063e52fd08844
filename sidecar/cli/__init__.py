"""``vllm-obs sidecar``: argument parsing only; the app is built in the handler."""

from __future__ import annotations

import argparse
from pathlib import Path

from obs.sidecar import defaults as D
from obs.sidecar.cli import hardening


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "sidecar",
        help="run the recording sidecar in front of vLLM pools",
        description=(
            "Relay the OpenAI-compatible API of one or more `vllm serve` pools and record "
            "every request: a JSONL event, an OpenTelemetry trace (five phases) and "
            "Prometheus metrics on /metrics. Give either --upstream (one pool) or --config "
            "(lanes and pools)."
        ),
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--upstream", metavar="URL", help="base URL of one vLLM pool, e.g. http://127.0.0.1:8001"
    )
    src.add_argument(
        "--config",
        metavar="FILE",
        type=Path,
        help="lanes/pools YAML config (see `vllm-obs config check`)",
    )
    p.add_argument("--host", default=D.HOST, help="address to listen on (default: %(default)s)")
    p.add_argument(
        "--port", type=int, default=D.PORT, help="port to listen on (default: %(default)s)"
    )
    p.add_argument(
        "--events",
        metavar="PATH",
        default=D.EVENTS,
        help="JSONL event log ('-' or 'none' to disable; default: %(default)s)",
    )
    p.add_argument(
        "--events-max-mb",
        type=float,
        default=D.EVENTS_MAX_MB,
        help="rotate the event log when it passes this size (default: %(default)s MB)",
    )
    p.add_argument(
        "--events-backups",
        type=int,
        default=D.EVENTS_BACKUPS,
        help="rotated event logs to keep (default: %(default)s)",
    )
    p.add_argument(
        "--events-flush-interval",
        type=float,
        default=D.EVENTS_FLUSH_INTERVAL_S,
        metavar="SECONDS",
        help="how often the event log's writer writes the events waiting (sooner when 1024 "
        "wait): how late a line reaches the file, and at most what a crash loses "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="OTLP/HTTP traces endpoint, e.g. http://127.0.0.1:4318/v1/traces "
        "(default: from OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT; no traces if unset)",
    )
    p.add_argument(
        "--otlp-metrics-endpoint",
        metavar="URL",
        help="send the OpenTelemetry GenAI metrics (gen_ai.server.time_to_first_token, ...) to "
        "this OTLP/HTTP endpoint, e.g. http://127.0.0.1:4318/v1/metrics (default: from "
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT; none if unset)",
    )
    p.add_argument(
        "--otlp-logs-endpoint",
        metavar="URL",
        help="also send each request's event as an OTLP log record to this OTLP/HTTP endpoint, "
        "e.g. http://127.0.0.1:4318/v1/logs (default: from OTEL_EXPORTER_OTLP_LOGS_ENDPOINT; "
        "none if unset)",
    )
    p.add_argument(
        "--pool-poll-interval",
        type=float,
        default=D.POOL_POLL_INTERVAL_S,
        metavar="SECONDS",
        help="how often to read each replica's /metrics for engine state (default: %(default)s)",
    )
    p.add_argument(
        "--model", help="with --upstream: the model alias the pool serves (for metric labels)"
    )
    p.add_argument(
        "--shutdown-grace",
        type=float,
        default=D.SHUTDOWN_GRACE_S,
        metavar="SECONDS",
        help="on SIGTERM, how long requests in flight may take to finish; those still running "
        "then end with an error frame or a 503 and are logged (default: %(default)s)",
    )
    p.add_argument(
        "--engine-traces",
        action="store_true",
        help="with --upstream: the pool exports its request spans to this sidecar "
        "(vllm serve --otlp-traces-endpoint http://SIDECAR:8000/v1/traces; SGLang and TGI: see "
        "docs/reference.md); events wait for them",
    )
    p.add_argument(
        "--engine-join-wait",
        type=float,
        default=D.ENGINE_JOIN_WAIT_S,
        metavar="SECONDS",
        help="longest an event waits for the engine's span before it is written without "
        "(default: %(default)s; vLLM batches spans every OTEL_BSP_SCHEDULE_DELAY, 5 s by default)",
    )
    p.add_argument(
        "--metrics-address",
        metavar="HOST:PORT",
        help="serve /metrics on this address instead of the relay's port (e.g. an internal "
        "interface the scraper reaches and clients do not); the relay's /metrics is then 404",
    )
    p.add_argument(
        "--capture-text",
        choices=["none", "prompt", "output", "all"],
        default="none",
        help="write the prompt and/or output text into each JSONL event (prompt_text, "
        "output_text), through the redaction hook; never into spans or logs (default: none)",
    )
    p.add_argument(
        "--redact-hook",
        metavar="MODULE:FUNCTION",
        help="with --capture-text: a str -> str function every captured text goes through "
        "(default: obs.sidecar.record.capture:redact, which masks e-mails, tokens, long "
        "numbers, IPs)",
    )
    p.add_argument(
        "--capture-max-chars",
        type=int,
        default=D.CAPTURE_MAX_CHARS,
        metavar="N",
        help="with --capture-text: keep at most N characters of each text (default: %(default)s)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=D.WORKERS,
        metavar="N",
        help="relay processes on the port, for more than one core's worth of traffic; "
        "metrics are merged across them, each enforces 1/N of every lane's limits, worker I>0 "
        "writes its events next to --events as NAME.wI.jsonl (default: %(default)s)",
    )
    p.add_argument(
        "--clickhouse-url",
        metavar="URL",
        help="also insert every event into ClickHouse over HTTP, e.g. http://HOST:8123 "
        "(credentials from CLICKHOUSE_USER and CLICKHOUSE_PASSWORD or CLICKHOUSE_PASSWORD_FILE; "
        "default: the config file's clickhouse.url; see docs/fleet.md)",
    )
    p.add_argument(
        "--clickhouse-table",
        metavar="DB.TABLE",
        help="table created by `vllm-obs clickhouse init` (default: vllm_obs.events)",
    )
    p.add_argument(
        "--clickhouse-spool",
        metavar="PATH",
        help="file that keeps events while ClickHouse is unreachable "
        "(default: clickhouse-spool.jsonl beside --events)",
    )
    p.add_argument(
        "--clickhouse-spool-max-mb",
        type=float,
        metavar="MB",
        help="largest spool; events past it are dropped and counted (default: 1024)",
    )
    p.add_argument(
        "--log-level", default=D.LOG_LEVEL, choices=["debug", "info", "warning", "error"]
    )
    hardening.add_arguments(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from obs.config import load_config, single_upstream
    from obs.errors import ConfigError
    from obs.exporters.clickhouse import clickhouse_settings
    from obs.sidecar.record.capture import TextCapture
    from obs.sidecar.serve import serve
    from obs.sidecar.settings import Settings

    config = (
        load_config(args.config)
        if args.config
        else single_upstream(args.upstream, args.model, args.engine_traces)
    )
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port: {args.port} is not a TCP port")
    if not args.events_flush_interval > 0:
        raise ConfigError(f"--events-flush-interval: {args.events_flush_interval} is not above 0")
    events = None if args.events in ("-", "none", "") else Path(args.events)
    metrics_address = _address(args.metrics_address) if args.metrics_address else None
    settings = Settings(
        config=config,
        host=args.host,
        port=args.port,
        events_path=events,
        events_max_bytes=int(args.events_max_mb * (1 << 20)),
        events_backups=args.events_backups,
        events_flush_interval_s=args.events_flush_interval,
        otlp_endpoint=args.otlp_endpoint,
        otlp_metrics_endpoint=_url(args.otlp_metrics_endpoint, "--otlp-metrics-endpoint"),
        otlp_logs_endpoint=_url(args.otlp_logs_endpoint, "--otlp-logs-endpoint"),
        pool_poll_interval_s=args.pool_poll_interval,
        shutdown_grace_s=args.shutdown_grace,
        log_level=args.log_level,
        engine_join_wait_s=args.engine_join_wait,
        metrics_address=metrics_address,
        capture=TextCapture.parse(args.capture_text, args.redact_hook, args.capture_max_chars),
        workers=args.workers,
        clickhouse=clickhouse_settings(
            config.clickhouse,
            url=args.clickhouse_url,
            table=args.clickhouse_table,
            spool=args.clickhouse_spool,
            spool_max_mb=args.clickhouse_spool_max_mb,
        ),
        split_salt=hardening.split_salt(args.split_salt_file, events, config),
        **hardening.settings_kwargs(args),
    )
    return serve(settings)


def _url(value: str | None, flag: str) -> str | None:
    """``value`` if it is an http(s) URL with a host (None stays None)."""
    from urllib.parse import urlsplit

    from obs.errors import ConfigError

    if value is None:
        return None
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"{flag}: {value!r} is not an http(s) URL, e.g. http://127.0.0.1:4318/v1/metrics"
        )
    return value


def _address(value: str) -> tuple[str, int]:
    return hardening.address(value, "--metrics-address")
