"""The relay benchmark's peers: named on demand, configured for the fake vLLM, never by default.

Nothing here installs or starts a peer (that needs the package index and a
minute); `python -m bench.relay --targets direct,litellm,vllm-router` does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bench import relay
from bench.peers import MODEL, PEERS, LiteLlm, VllmRouter


def test_peers_are_optional_targets() -> None:
    """litellm and vllm-router are accepted by --targets but not in the default set."""
    assert set(PEERS) == {"litellm", "vllm-router"}
    assert relay.parse_args([]).target_names == ["direct", "sidecar", "nginx"]
    args = relay.parse_args(["--targets", "direct,litellm,vllm-router"])
    assert args.target_names == ["direct", "litellm", "vllm-router"]


def test_peer_requirements_are_pinned() -> None:
    """Every peer requirement names one exact version."""
    for peer in PEERS.values():
        assert peer.requirements and all("==" in r for r in peer.requirements)


@pytest.mark.inproc
def test_litellm_forwards_the_bench_model_to_the_fake(tmp_path: Path) -> None:
    """LiteLLM's config maps the model the client sends to the fake's /v1, one worker."""
    server = LiteLlm(tmp_path, Path("/peer/bin"), "http://127.0.0.1:9")
    conf = yaml.safe_load((tmp_path / "litellm.yaml").read_text())
    (entry,) = conf["model_list"]
    assert entry["model_name"] == MODEL
    assert entry["litellm_params"]["api_base"] == "http://127.0.0.1:9/v1"
    assert server.cmd[server.cmd.index("--num_workers") + 1] == "1"
    assert server.env is not None and server.env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"


@pytest.mark.inproc
def test_vllm_router_has_the_fake_as_its_one_worker(tmp_path: Path) -> None:
    """The router's worker list is the fake alone, and it listens on loopback."""
    server = VllmRouter(tmp_path, Path("/peer/bin"), "http://127.0.0.1:9")
    i = server.cmd.index("--worker-urls")
    assert server.cmd[i + 1] == "http://127.0.0.1:9" and server.cmd[i + 2].startswith("--")
    assert server.cmd[server.cmd.index("--host") + 1] == "127.0.0.1"
    assert server.url.startswith("http://127.0.0.1:")
