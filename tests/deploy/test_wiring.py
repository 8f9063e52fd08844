"""Every address a shipped service sends to (flags, environment, mounted config files) is a port
its target's own command listens on, in docker-compose.yml and in every rendered kustomize
tree (``obs.deploy.wiring``); declared ports and probes are ones the commands listen on."""

from __future__ import annotations

from pathlib import Path

import pytest

from obs.cli import main
from obs.deploy import manifest, wiring

pytestmark = pytest.mark.process  # kubectl kustomize

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
TREES = [K8S, *sorted(p.parent for p in K8S.glob("overlays/*/kustomization.yaml"))]


def _bad(deployment: manifest.Deployment) -> list[str]:
    return [
        f"{v.send.unit}/{v.send.container} ({v.send.where}) -> {v.send.url}: {v.why}"
        for v in wiring.check(deployment)
        if not v.ok
    ]


def test_every_compose_address_reaches_a_listener_of_its_target() -> None:
    """In docker-compose.yml every URL and scrape target hits a port its target listens on,
    vLLM's spans go to the sidecar's own port, and no service declares a port it does not
    listen on."""
    compose = manifest.compose(ROOT / "docker-compose.yml")
    verdicts = wiring.check(compose)
    assert _bad(compose) == []
    spans = {(v.send.unit, v.target, v.send.port) for v in verdicts if "/v1/traces" in v.send.url}
    assert spans >= {("vllm-interactive", "sidecar", 8000), ("vllm-bulk", "sidecar", 8000)}
    assert [v for v in verdicts if not v.target] == []  # nothing outside the stack
    assert wiring.undeclared(compose) == []


@pytest.mark.parametrize("tree", TREES, ids=lambda p: str(p.relative_to(K8S)) or "all")
def test_every_rendered_k8s_address_reaches_a_listener(tree: Path) -> None:
    """In each rendered kustomize tree every address resolves to a listener (localhost is the
    pod), declared ports and probes are on listeners, and each ServiceMonitor endpoint is a
    Service port that a selected pod listens on."""
    deployment = manifest.kubernetes(tree)
    assert _bad(deployment) == []
    assert wiring.undeclared(deployment) == []
    assert wiring.probe_problems(deployment) == []
    assert wiring.monitor_problems(deployment) == []
    outside = {v.send.host for v in wiring.check(deployment) if not v.target}
    assert outside <= {"otel-collector.observability"}  # the cluster's collector, documented


def test_every_container_of_the_pools_has_a_liveness_probe() -> None:
    """Each pool pod's containers have a liveness probe: vLLM's /health on its port, the
    sidecar's /health on its --health-address listener (which client floods do not reach)."""
    pools = [u for u in manifest.kubernetes(K8S).units if u.name.startswith("vllm-")]
    assert {u.name for u in pools} == {"vllm-interactive", "vllm-bulk"}
    for pod in pools:
        for c in pod.containers:
            probe = c.probes.get("livenessProbe")
            assert probe is not None, f"{pod.name}/{c.name}"
            assert probe["httpGet"]["path"] == "/health"
            port = c.port_number(probe["httpGet"]["port"])
            if c.name == "sidecar":
                assert f":{port}" in (wiring.flag(c.argv, "--health-address") or "")
                assert port != int(wiring.flag(c.argv, "--port") or 0)
            else:
                assert port == int(wiring.flag(c.argv, "--port") or 0)


def test_a_span_endpoint_nobody_listens_on_fails(tmp_path: Path) -> None:
    """The check bites: vLLM pointed at the sidecar's old port 4318 is reported, naming it."""
    text = (ROOT / "docker-compose.yml").read_text(encoding="utf-8")
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(
        text.replace("http://sidecar:8000/v1/traces", "http://sidecar:4318/v1/traces")
    )
    (tmp_path / "deploy").symlink_to(ROOT / "deploy")
    bad = _bad(manifest.compose(broken))
    assert len(bad) == 2 and all("nothing listens on 4318" in b for b in bad), bad


def test_deploy_check_cli_prints_each_address_and_fails_on_a_dead_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``vllm-obs deploy check`` lists each address with its listener and exits 0 on the
    shipped files, 1 on a compose file with a dead address."""
    assert main(["deploy", "check", "--compose", str(ROOT / "docker-compose.yml")]) == 0
    out = capsys.readouterr().out
    assert "vllm-interactive -> http://sidecar:8000/v1/traces: sidecar listens on 8000" in out
    text = (ROOT / "docker-compose.yml").read_text(encoding="utf-8")
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(text.replace("http://clickhouse:8123", "http://clickhouse:8124"))
    (tmp_path / "deploy").symlink_to(ROOT / "deploy")
    assert main(["deploy", "check", "--compose", str(broken)]) == 1
    assert "clickhouse-init -> http://clickhouse:8124: clickhouse: nothing listens on 8124" in (
        capsys.readouterr().err
    )


def test_deploy_run_refuses_bad_input_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`vllm-obs deploy run` exits 2 with a message, nothing started, for a network that is
    not loopback, one too small for the units, or a file that is not a compose file."""
    compose = str(ROOT / "docker-compose.yml")
    assert main(["deploy", "run", "compose", "--file", compose, "--network", "10.0.0.0/24"]) == 2
    assert "give a loopback range" in capsys.readouterr().err
    assert main(["deploy", "run", "compose", "--file", compose, "--network", "127.0.5.0/30"]) == 2
    assert "11 units need as many addresses" in capsys.readouterr().err
    (tmp_path / "x.yml").write_text("a: 1\n")
    assert main(["deploy", "run", "compose", "--file", str(tmp_path / "x.yml")]) == 2
    assert "no services: not a compose file" in capsys.readouterr().err
