"""The sidecar's hardening flags (docs/security.md), a part of `vllm-obs sidecar`'s parser."""

from __future__ import annotations

import argparse
import os
import secrets
from pathlib import Path
from typing import Any

from obs import splits
from obs.config import Config
from obs.errors import ConfigError
from obs.numerals import whole_number
from obs.sidecar.server.limits import Limits

_D = Limits()


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("limits (see docs/security.md)")
    g.add_argument(
        "--max-header-kb",
        type=int,
        default=_D.max_header_bytes >> 10,
        help="request line and headers together, at most this many KiB; more is refused "
        "with 431 (default: %(default)s)",
    )
    g.add_argument(
        "--max-headers",
        type=int,
        default=_D.max_headers,
        help="headers per request; more is refused with 431 (default: %(default)s)",
    )
    g.add_argument(
        "--max-request-line",
        type=int,
        default=_D.max_request_line,
        metavar="BYTES",
        help="length of the request target; longer is refused with 414 (default: %(default)s)",
    )
    g.add_argument(
        "--header-timeout",
        type=float,
        default=_D.header_timeout_s,
        metavar="SECONDS",
        help="from a request's first byte to the end of its headers; slower is answered 408 "
        "and closed (default: %(default)s)",
    )
    g.add_argument(
        "--body-timeout",
        type=float,
        default=_D.body_timeout_s,
        metavar="SECONDS",
        help="from the end of the headers to the end of the body; slower is answered 408 "
        "and closed (default: %(default)s)",
    )
    g.add_argument(
        "--body-idle-timeout",
        type=float,
        default=_D.body_idle_timeout_s,
        metavar="SECONDS",
        help="a body that sends no byte for this long is answered 408 and closed, whatever "
        "--body-timeout leaves (default: %(default)s)",
    )
    g.add_argument(
        "--body-stall",
        type=float,
        default=_D.body_stall_s,
        metavar="SECONDS",
        help="at --max-connections, a body that sent no byte for this long may be evicted "
        "(408) for a newcomer (default: %(default)s)",
    )
    g.add_argument(
        "--min-body-rate",
        type=int,
        default=_D.min_body_rate,
        metavar="BYTES_PER_S",
        help="at --max-connections, a body arriving slower than this (averaged since its "
        "head) may be evicted (408) for a newcomer (default: %(default)s)",
    )
    g.add_argument(
        "--idle-timeout",
        type=float,
        default=_D.idle_timeout_s,
        metavar="SECONDS",
        help="a connection that sends no request (first or next) is closed after this "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--max-connections",
        type=int,
        default=_D.max_connections,
        help="open client connections; one more is answered 503 and closed. Lowered at start "
        "to what the open-file limit allows (its soft limit is raised to the hard one first): "
        "(nofile - 128) / 2 (default: %(default)s)",
    )
    g.add_argument(
        "--max-client-connections",
        type=int,
        metavar="N",
        help="open connections from one client address; one more is answered 503 and closed "
        "(default: a quarter of --max-connections; behind a proxy that all clients share, "
        "set it to --max-connections)",
    )
    g.add_argument(
        "--max-body-memory-mb",
        type=int,
        default=_D.max_body_memory >> 20,
        metavar="MB",
        help="request body bytes held at once, all clients together (counted as they arrive, "
        "not as declared, until the response ends); a body past it is answered 503 and closed "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--max-client-body-memory-mb",
        type=int,
        metavar="MB",
        help="request body bytes one client address holds at once "
        "(default: a quarter of --max-body-memory-mb)",
    )
    g.add_argument(
        "--max-json-elements",
        type=int,
        default=200_000,
        metavar="N",
        help="JSON values a request body over 256 KiB may hold; more is refused with 413 "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--client-events-per-s",
        "--rejected-events-per-s",
        dest="rejected_events_per_s",
        type=float,
        default=50.0,
        metavar="N",
        help="the event budget for client-caused events before a pool (refusals: 401, 400, "
        "413, 429; clients that leave before a pool: client_disconnect): this many written one "
        "by one a second, the rest counted in a summary record per lane and outcome each "
        "second (default: %(default)s)",
    )
    g.add_argument(
        "--max-tenants-per-client",
        type=int,
        default=8,
        metavar="N",
        help="tenants named by auth.tenant_header that one client address may bring within a "
        "minute; its others share one fair-share key (tenants from API keys the sidecar "
        "checks are never bounded). Behind a gateway that sets the header, raise it to the "
        "number of tenants, or 0 for no bound (default: %(default)s)",
    )
    g.add_argument(
        "--health-address",
        metavar="HOST:PORT",
        help="also serve GET /health and GET /ready on this address, on a listener of its own "
        "that no flood of the relay's port reaches: /health (liveness) is 503 when the relay's "
        "event loop has not turned for 10 s, /ready (readiness) also while the relay is full",
    )
    g.add_argument(
        "--split-salt-file",
        metavar="PATH",
        help="the secret that keys a split lane's arm hash, so nobody can work out offline which "
        f"API keys land in the canary: read from {splits.SALT_ENV} when set (give every "
        "sidecar of a fleet the same one), else from this file, made (random, mode 0600) "
        "when missing and kept (default: vllm-obs-split-salt beside the events file; "
        "without an events file, a new salt each start)",
    )
    g.add_argument(
        "--traces-token-env",
        metavar="NAME",
        help="environment variable holding a token that every POST /v1/traces must carry "
        "(Authorization: Bearer TOKEN), from any address, the pools' included; without it "
        "only the traced pools' addresses may send",
    )


def settings_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The ``Settings`` fields these flags set, checked."""
    positive = {
        "--max-header-kb": args.max_header_kb,
        "--max-headers": args.max_headers,
        "--max-request-line": args.max_request_line,
        "--header-timeout": args.header_timeout,
        "--body-timeout": args.body_timeout,
        "--body-idle-timeout": args.body_idle_timeout,
        "--body-stall": args.body_stall,
        "--min-body-rate": args.min_body_rate,
        "--idle-timeout": args.idle_timeout,
        "--max-connections": args.max_connections,
        "--max-json-elements": args.max_json_elements,
        "--max-body-memory-mb": args.max_body_memory_mb,
    }
    optional = {
        "--max-client-connections": args.max_client_connections,
        "--max-client-body-memory-mb": args.max_client_body_memory_mb,
    }
    positive.update({k: v for k, v in optional.items() if v is not None})
    for flag, value in positive.items():
        if not value > 0:
            raise ConfigError(f"{flag}: must be positive, got {value}")
    if args.traces_token_env and not os.environ.get(args.traces_token_env):
        raise ConfigError(f"--traces-token-env: {args.traces_token_env} is not set or empty")
    if args.max_tenants_per_client < 0:
        raise ConfigError("--max-tenants-per-client: must be 0 or more")
    if args.rejected_events_per_s < 0:
        raise ConfigError("--client-events-per-s: must be 0 or more")
    limits = Limits(
        max_request_line=args.max_request_line,
        max_header_bytes=args.max_header_kb << 10,
        max_headers=args.max_headers,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        body_idle_timeout_s=args.body_idle_timeout,
        body_stall_s=args.body_stall,
        min_body_rate=args.min_body_rate,
        idle_timeout_s=args.idle_timeout,
        max_connections=args.max_connections,
        max_client_connections=args.max_client_connections,
        max_body_memory=args.max_body_memory_mb << 20,
        max_client_body_memory=None
        if args.max_client_body_memory_mb is None
        else args.max_client_body_memory_mb << 20,
    )
    return {
        "health_address": address(args.health_address, "--health-address")
        if args.health_address
        else None,
        "limits": limits,
        "traces_token_env": args.traces_token_env,
        "max_json_elements": args.max_json_elements,
        "rejected_events_per_s": args.rejected_events_per_s,
        "max_tenants_per_client": args.max_tenants_per_client,
    }


MIN_SALT = 16  # bytes


def split_salt(path: str | None, events: Path | None, config: Config) -> bytes:
    """The split salt (see ``--split-salt-file``); empty when no lane splits its traffic."""
    env = os.environ.get(splits.SALT_ENV, "")
    if env:
        if len(env) < MIN_SALT:
            raise ConfigError(f"{splits.SALT_ENV}: at least {MIN_SALT} characters, please")
        return env.encode()
    if not any(lane.split is not None for lane in config.lanes):
        return b""
    if path:
        where = Path(path)
    elif events is not None:
        where = events.parent / SALT_FILE
    else:  # nowhere to keep one: this run's own (arms may change at the next start)
        return secrets.token_hex(32).encode()
    try:
        fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    except OSError as err:
        raise ConfigError(f"--split-salt-file: cannot create {where}: {err.strerror}") from err
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    try:
        salt = where.read_bytes().strip()
    except OSError as err:
        raise ConfigError(f"--split-salt-file: cannot read {where}: {err.strerror}") from err
    if len(salt) < MIN_SALT:
        raise ConfigError(f"--split-salt-file: {where} holds under {MIN_SALT} bytes")
    return salt


SALT_FILE = "vllm-obs-split-salt"


def address(value: str, flag: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``[V6]:PORT``) of a listener flag, checked."""
    host, sep, text = value.rpartition(":")
    port = whole_number(text)
    if not sep or not host or port is None or not 0 < port < 65536:
        raise ConfigError(f"{flag}: {value!r} is not HOST:PORT, e.g. 10.0.0.5:9464")
    return host.strip("[]"), port
