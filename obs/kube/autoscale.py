"""The Kubernetes package's autoscaling component (``deploy/k8s/autoscaling``): a
``HorizontalPodAutoscaler`` per pool on the sidecar's measure of the pool's saturation, through
the Prometheus adapter.

The signal is the sidecar's own reading of its engine: ``vllm_obs_pool_requests_running`` plus
``vllm_obs_pool_requests_waiting`` per pod (the requests the engine holds), served to the HPA as
the pods metric ``vllm_obs_pool_requests`` by the adapter rule in
``autoscaling/prometheus-adapter.yaml``. Each pool's target is ``TARGET_SHARE`` of its
``max_num_seqs`` (the engine's batch): above it requests start to queue in the engine, which
is where TTFT goes. A HorizontalPodAutoscaler and not a KEDA ``ScaledObject``: the HPA is
core Kubernetes (no operator or CRDs to install, checked against the API schemas), and the
adapter is one deployment most Prometheus setups (kube-prometheus-stack) already have.

Bounds: ``hpa.yaml`` (generated here, from the lanes config) starts each pool at
``DEFAULT_BOUNDS``; ``bounds.yaml`` beside it is a patch of each HPA's ``minReplicas`` and
``maxReplicas`` that ``vllm-obs plan --k8s`` writes from a plan (``bounds_patch``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import yaml

from obs import conventions as c
from obs.config import Config

METRIC: Final = "vllm_obs_pool_requests"  # the adapter's name for running + waiting, per pod
SOURCES: Final = (c.POOL_RUNNING.name, c.POOL_WAITING.name)
TARGET_SHARE: Final = 0.8  # of max_num_seqs, per pod on average
DEFAULT_MAX_NUM_SEQS: Final = 256  # vLLM's default when the pool declares none
DEFAULT_BOUNDS: Final = (1, 4)
DIR: Final = "autoscaling"
BOUNDS_HEADER: Final = (
    "# Each pool's autoscaler bounds: a patch of autoscaling/hpa.yaml.\n"
    "# Written by `vllm-obs plan --k8s` ({source}); edit freely or plan again.\n"
)


def deployment_name(pool: str) -> str:
    """The pool's Deployment in the rendered package (base ``vllm`` + overlay suffix)."""
    return f"vllm-{pool}"


def target(config: Config, pool: str) -> int:
    """Requests per pod the HPA holds each pool at: ``TARGET_SHARE`` of its batch."""
    (spec,) = [p for p in config.pools if p.name == pool]
    declared = spec.declared.values() if spec.declared is not None else {}
    seqs = int(declared.get("max_num_seqs") or DEFAULT_MAX_NUM_SEQS)  # type: ignore[call-overload]
    return max(1, int(seqs * TARGET_SHARE))


def hpa(config: Config, pool: str, bounds: tuple[int, int] = DEFAULT_BOUNDS) -> dict[str, Any]:
    name = deployment_name(pool)
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "vllm-obs"}},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": bounds[0],
            "maxReplicas": bounds[1],
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": METRIC},
                        "target": {
                            "type": "AverageValue",
                            "averageValue": str(target(config, pool)),
                        },
                    },
                }
            ],
            # A vLLM replica takes minutes to load its model: add quickly, remove slowly.
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 60},
                "scaleDown": {"stabilizationWindowSeconds": 600},
            },
        },
    }


def hpa_file(config: Config, header: str) -> str:
    docs = [hpa(config, p.name) for p in config.pools]
    return header + yaml.safe_dump_all(docs, sort_keys=False)


def bounds_patch(bounds: Mapping[str, tuple[int, int]], source: str) -> str:
    """The patch setting each pool's HPA bounds (strategic merge, one document per pool)."""
    docs = [
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": deployment_name(pool)},
            "spec": {"minReplicas": low, "maxReplicas": max(low, high)},
        }
        for pool, (low, high) in bounds.items()
    ]
    return BOUNDS_HEADER.format(source=source) + yaml.safe_dump_all(docs, sort_keys=False)


def write_bounds(package: Path, bounds: Mapping[str, tuple[int, int]], source: str) -> Path:
    """``package/autoscaling/bounds.yaml`` for ``bounds`` (pool -> (min, max))."""
    path = package / DIR / "bounds.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(bounds_patch(bounds, source), encoding="utf-8")
    return path
