"""``vllm-obs k8s --out DIR``: write the generated parts of the Kubernetes package."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "k8s",
        help="write the generated parts of the kustomize package (deploy/k8s)",
        description="Write what the kustomize package in deploy/k8s takes from the lanes "
        "config: each pool overlay's lanes.yaml (the pool's lanes, on the vLLM container "
        "beside the sidecar), monitoring/prometheusrule.yaml (the rules `vllm-obs alerts` "
        "writes, as one PrometheusRule) and monitoring/dashboards.yaml (the dashboards as "
        "ConfigMaps labelled grafana_dashboard) and each overlay's vllm.yaml (the vLLM container's "
        "arguments, from the pool's engine block). The hand-written files (base/, each "
        "overlay's kustomization) are not touched. See docs/kubernetes.md.",
    )
    p.add_argument("--config", type=Path, help="lanes YAML (default: the shipped default)")
    p.add_argument(
        "--out", type=Path, default=Path("deploy/k8s"), help="package root (default: %(default)s)"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 listing the generated files that are missing or stale",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from obs.config import default_config_path, load_config
    from obs.kube import package as kube

    path: Path = args.config or default_config_path()
    config = load_config(path)
    if args.check:
        stale = kube.stale(config, path.name, args.out)
        for name in stale:
            print(f"stale: {args.out / name}", file=sys.stderr)
        if stale:
            print(f"regenerate: vllm-obs k8s --out {args.out}", file=sys.stderr)
        return 1 if stale else 0
    for written in kube.write(config, path.name, args.out):
        print(written)
    return 0
