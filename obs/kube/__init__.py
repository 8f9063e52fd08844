"""``vllm-obs k8s``: the Kubernetes package's generated parts (``deploy/k8s``):
:mod:`~obs.kube.package` writes them from the alert and dashboard generators,
:mod:`~obs.kube.cli` is the command."""
