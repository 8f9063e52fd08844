"""``vllm-obs plan``: from recorded traffic to the replicas and lane limits that meet every SLO.

traffic (what the events say: arrivals per lane per interval, a bounded sample of request
shapes) -> resample (arrivals at ``--growth``, drawn again, not compressed) -> replay (one
pool's lanes on N simulated replicas in virtual time) -> search (fewest replicas, limits by
Little's law, each checked by replay) -> report (plan.json, lanes.yaml, kustomize patch,
tables, HTML curve). docs/plan.md says how and with what error bars.
"""
