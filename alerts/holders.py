"""Who holds the pool when a lane's budget burns: the burn-rate alerts' ``top_cause`` names the
other lane holding most of its pool's prompt tokens not yet prefilled, from the sidecar's
occupancy gauges (``vllm_obs_replica_lane_prefill_tokens``, docs/record.md), and the sequences
it has decoding: the lane an operator moves to its own pool (``vllm-obs query incident`` names
the same lane as the trigger from the events)."""

from __future__ import annotations

from obs import conventions as c

from . import expr as e


def holder_query(pool: str, lane: str) -> str:
    """PromQL: the other lane holding most of ``pool``'s prompt tokens now (none: no sample)."""
    sel = e.selector(c.OCCUPANCY_PREFILL_TOKENS.name, e.eq(c.POOL, pool), f'{c.LANE}!="{lane}"')
    return f"topk(1, {e.agg('sum', sel, c.LANE)} > 0)"


def holder_note(pool: str, lane: str) -> str:
    """The sentence the burn-rate alerts' ``top_cause`` ends with."""
    return (
        f" Holding pool {pool} now: {{{{ range query `{holder_query(pool, lane)}` }}}}"
        'lane {{ .Labels.lane }} with {{ printf "%.0f" .Value }} prompt tokens waiting or '
        f"prefilling (move it to its own pool: vllm-obs query incident names the trigger)"
        f"{{{{ else }}}}no other lane's prompts{{{{ end }}}}."
    )
