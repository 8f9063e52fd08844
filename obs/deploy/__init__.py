"""``vllm-obs deploy``: the shipped deployments (docker-compose.yml, the kustomize package in
deploy/k8s) read as written: :mod:`~obs.deploy.manifest` parses them into units (a compose
service, a pod) of containers, :mod:`~obs.deploy.wiring` checks that every address a container
sends to is a port its target's own command listens on, :mod:`~obs.deploy.launch` turns a
container into a local process on a loopback address, :mod:`~obs.deploy.stack` starts and stops
them all, :mod:`~obs.deploy.cli` is the command. See docs/deploy.md."""
