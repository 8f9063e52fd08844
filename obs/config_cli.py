"""``vllm-obs config check FILE``: validate a lanes config and print what it resolves to."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "config",
        help="validate and show a lanes/SLO config",
        description="Work with the lanes/pools/SLO config that the sidecar, alerts "
        "and dashboards share.",
    )
    cs = p.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    check = cs.add_parser(
        "check",
        help="validate a config and print the resolved pools, lanes, rules and SLOs",
        description="Validate FILE (default: the shipped default config) and print what it "
        "resolves to. FILE may also be a sweep profile (docs/sweep.md). Exit status 2 and an "
        "error naming the field when it is invalid.",
    )
    check.add_argument("file", nargs="?", help="lanes YAML file (default: the shipped default)")
    check.set_defaults(handler=run_check)
    hk = cs.add_parser(
        "hash-key",
        help="print the auth.api_keys entry for a client API key (read from stdin)",
        description="Read one client API key from stdin (a terminal prompts without echo) and "
        "print the config entry that maps its SHA-256 to TENANT. The key itself is never "
        "stored: the sidecar hashes each request's bearer token and looks the hash up.",
    )
    hk.add_argument("tenant", help="tenant name the key belongs to (lower case, digits, - or _)")
    hk.set_defaults(handler=run_hash_key)


def describe(config: object) -> str:
    from obs.config import Config

    assert isinstance(config, Config)
    lines = ["pools:"]
    for p in config.pools:
        model = f" model={p.model}" if p.model else ""
        lines.append(
            f"  {p.name}: {', '.join(p.replicas)}{model} kv_cache_usage_max={p.kv_cache_usage_max}"
        )
    lines.append(f"lanes (rules tried in this order; default lane: {config.default_lane}):")
    for lane in config.lanes:
        a = lane.admission
        lim = [
            f"{k}={v}"
            for k, v in (
                ("max_concurrency", a.max_concurrency),
                ("max_queue", a.max_queue),
                ("queue_timeout_s", a.queue_timeout_s),
                ("max_prompt_tokens", a.max_prompt_tokens),
                ("token_budget", a.token_budget),
            )
            if v is not None
        ]
        if a.tenant_fair_share:
            lim.append("tenant_fair_share")
        lim.append(f"slow_client={a.slow_client.policy}@{a.slow_client.buffer_bytes}B")
        lines.append(f"  {lane.name} -> {_targets(lane)} (routing {lane.routing})")
        for rule in lane.match:
            cond = " and ".join(f"{k}={v}" for k, v in rule.model_dump(exclude_none=True).items())
            lines.append(f"    match: {cond}")
        if not lane.match:
            lines.append("    match: (no rules)")
        lines.append(f"    admission: {', '.join(lim) or 'unlimited'}")
        t = lane.timeouts
        lines.append(
            f"    timeouts: connect {t.connect_s:g} s, first token {t.first_token_s:g} s, "
            f"idle {t.idle_s:g} s"
        )
        slo = lane.slo
        parts = []
        if slo.ttft:
            parts.append(f"TTFT <= {slo.ttft.threshold_ms:g} ms for {slo.ttft.objective:.1%}")
        if slo.tpot:
            parts.append(f"TPOT <= {slo.tpot.threshold_ms:g} ms for {slo.tpot.objective:.1%}")
        if slo.itl:
            parts.append(
                f"ITL p95 <= {slo.itl.threshold_ms:g} ms for {slo.itl.objective:.1%} of requests"
            )
        if slo.availability:
            parts.append(f"availability {slo.availability.objective:.2%}")
        if slo.cache_hit_ratio_min:
            parts.append(f"cache hit ratio >= {slo.cache_hit_ratio_min:.0%}")
        lines.append(f"    slo: {'; '.join(parts) or 'none'}")
    auth = config.auth
    keys = f"{len(auth.api_keys)} API key(s), 401 without one" if auth.api_keys else "no API keys"
    header = f"; tenant header {auth.tenant_header}" if auth.tenant_header else ""
    lines.append(f"auth: {keys}{header}")
    return "\n".join(lines)


def run_check(args: argparse.Namespace) -> int:
    from obs.config import default_config_path, load_config

    path = args.file or default_config_path()
    if args.file is not None and _is_profile(path):
        return _check_profile(path)
    config = load_config(path)
    print(f"{path}: ok")
    print(describe(config))
    for line in warnings(config):
        print(f"warning: {line}", file=sys.stderr)
    return 0


def warnings(config: object) -> list[str]:
    """What the config allows that a client could turn against other clients."""
    from obs.config import Config

    assert isinstance(config, Config)
    out = []
    for lane in config.lanes:
        p = lane.priority
        if p is not None and p.header is not None:
            cap = (
                "capped at their tenant's level" if p.tenants else "with no tenant levels to cap it"
            )
            out.append(
                f"lane {lane.name}: any client may set its own priority with the "
                f"{p.header} header ({cap}); name priority.header only when a gateway in "
                "front sets or strips it"
            )
    return out


def _is_profile(path: str | Path) -> bool:
    """A sweep profile (``name:``/``base_lanes:`` at the top) rather than a lanes config."""
    import yaml

    from obs.sweep.profile import is_profile

    try:
        with open(path, encoding="utf-8") as f:
            return is_profile(yaml.safe_load(f))
    except (OSError, yaml.YAMLError):
        return False  # load_config reports it


def _check_profile(path: str | Path) -> int:
    from obs.sweep.profile import PLACEHOLDER_URL, load_profile

    profile = load_profile(path)
    print(f"{path}: ok (sweep profile {profile.name}: {profile.description})")
    print("engines (vllm serve flags per pool):")
    for pool, flags in profile.engines.items():
        print(f"  {pool}: {flags.describe()}")
    print(describe(profile.config).replace(PLACEHOLDER_URL, "(local, started by the sweep)"))
    return 0


def run_hash_key(args: argparse.Namespace) -> int:
    import getpass
    import hashlib
    import re
    import sys

    from obs.config_blocks import NAME_RE
    from obs.errors import InputError

    if not re.match(NAME_RE, args.tenant):
        raise InputError(f"tenant {args.tenant!r} must match {NAME_RE}")
    key = getpass.getpass("API key: ") if sys.stdin.isatty() else sys.stdin.readline()
    key = key.strip()
    if not key:
        raise InputError("no key given on stdin")
    digest = hashlib.sha256(key.encode()).hexdigest()
    print("auth:\n  api_keys:")
    print(f"    - sha256: {digest}\n      tenant: {args.tenant}")
    return 0


def _targets(lane: Any) -> str:
    """``pool P``, or ``split a 95 / b 5 (sticky by api_key)``, then any fallback."""
    if lane.split is None:
        out = f"pool {lane.pool}"
    else:
        arms = " / ".join(f"{p} {w}" for p, w in lane.arms)
        out = f"split {arms} (baseline {lane.pool}, sticky by {lane.canary_policy.sticky})"
    if lane.fallback is not None:
        out += f", fallback {lane.fallback}"
    if lane.priority is not None:
        out += ", priority"
    return out
