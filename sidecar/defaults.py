"""The sidecar's defaults, written once: ``Settings`` (settings.py) and ``vllm-obs sidecar``'s
flags (cli.py) both read them. Constants only, so ``vllm-obs --help`` imports nothing more."""

from __future__ import annotations

from typing import Final

HOST: Final = "127.0.0.1"
PORT: Final = 8000
EVENTS: Final = "events.jsonl"
EVENTS_MAX_MB: Final = 256
EVENTS_BACKUPS: Final = 10
EVENTS_FLUSH_INTERVAL_S: Final = 0.2
POOL_POLL_INTERVAL_S: Final = 5.0
SHUTDOWN_GRACE_S: Final = 30.0
ENGINE_JOIN_WAIT_S: Final = 6.0  # vLLM batches spans every OTEL_BSP_SCHEDULE_DELAY (5 s)
CAPTURE_MAX_CHARS: Final = 4096
WORKERS: Final = 1
LOG_LEVEL: Final = "info"
