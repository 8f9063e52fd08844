"""The Admission dashboard's flow-control row (docs/flow.md), only for a config with
saturated pools or rate-limited tenants: pool queue depth by band, pools held, requests held
and refused by gate, tenants' usage against their limits."""

from __future__ import annotations

from obs import conventions as c
from obs.config import Config

from . import expr as e
from .panels import Grid, Query, timeseries

# Which gate each refusal reason names (the reason label of admission_rejections).
GATE_REASONS = (
    ("rate_limit", (c.RATE_LIMIT_REQUESTS, c.RATE_LIMIT_TOKENS, c.RATE_LIMIT_STORE)),
    ("pool", (c.POOL_QUEUE_FULL, c.POOL_QUEUE_TIMEOUT)),
)


def used(config: Config) -> bool:
    return bool(config.tenants) or any(p.saturation is not None for p in config.pools)


def add_row(config: Config, grid: Grid) -> None:
    """The flow-control panels, where the config uses flow control."""
    if not used(config):
        return
    grid.row("Flow control")
    queued = e.selector(c.FLOW_QUEUED.name, e.POOL_VAR)
    grid.add(
        timeseries(
            "Pool queue depth by band",
            [Query(e.sum_by(queued, c.POOL, c.BAND), "{{pool}} band {{band}}")],
            unit="short",
            description="Requests waiting in a saturated pool's one queue, by priority band "
            "(all sidecar processes).",
            stack=True,
        ),
        8,
        8,
    )
    held = e.selector(e.total(c.FLOW_HELD_REQUESTS), e.POOL_VAR)
    grid.add(
        timeseries(
            "Held by gate",
            [
                Query(e.sum_by(e.rate(held), c.POOL, c.GATE), "{{pool}} {{gate}}"),
                Query(
                    e.sum_by(e.selector(c.FLOW_HELD.name, e.POOL_VAR), c.POOL),
                    "{{pool}} processes holding",
                ),
            ],
            unit="short",
            description="Requests per second that waited for room in their pool, by the bound "
            "that held them, and the sidecar processes holding each pool now.",
        ),
        8,
        8,
    )
    grid.add(
        timeseries(
            "Refusals by gate",
            [
                Query(
                    e.sum_by(
                        e.rate(
                            e.selector(
                                e.total(c.ADMISSION_REJECTIONS),
                                e.LANE_VAR,
                                e.like(c.REASON, "|".join(rs)),
                            )
                        ),
                        c.LANE,
                    ),
                    f"{{{{lane}}}} {gate}",
                )
                for gate, rs in GATE_REASONS
            ],
            unit="reqps",
            description="Requests refused per second by the rate limits and by the pools' "
            "queues (the lanes' own refusals are above).",
            stack=True,
        ),
        8,
        8,
    )
    per_min = e.sum_by(e.rate(e.total(c.RATE_LIMIT_USED), "1m"), c.TENANT, c.KIND)
    limit = e.sum_by(c.RATE_LIMIT.name, c.TENANT, c.KIND)
    grid.add(
        timeseries(
            "Tenant usage against limits",
            [Query(f"60 * {per_min}\n/ on ({c.TENANT}, {c.KIND})\n{limit}", "{{tenant}} {{kind}}")],
            unit="percentunit",
            description="What each limited tenant used per minute (requests, and tokens as "
            "used), as a share of its limit; near 100% its requests are refused 429.",
        ),
        24,
        8,
    )
