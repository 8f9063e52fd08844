"""How ``vllm-obs deploy run`` turns a manifest's text into a local process's (obs.deploy.launch,
obs.deploy.stack): names before a port become addresses, binds the unit's address, mount points
the run's paths, and vLLM's command keeps every flag but ``--model``."""

from __future__ import annotations

from pathlib import Path

import pytest

from obs.deploy.launch import Rewriter, vllm_argv
from obs.deploy.manifest import Unit
from obs.deploy.stack import addresses
from obs.errors import ConfigError

NAMES = {"sidecar": "127.0.5.4", "vllm-bulk": "127.0.5.2"}
MOUNTS = {"/etc/prometheus/rules": Path("/run/rules"), "/prometheus": Path("/run/data")}


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("http://sidecar:8000/v1/traces", "http://127.0.5.4:8000/v1/traces"),
        ('targets: ["vllm-bulk:8000"]', 'targets: ["127.0.5.2:8000"]'),
        ("sidecar", "sidecar"),  # `vllm-obs sidecar`: a name without a port is a word
        ("my-vllm-bulk:8000", "my-vllm-bulk:8000"),  # another name that ends in one
        ("0.0.0.0", "127.0.5.9"),  # --host 0.0.0.0
        ("0.0.0.0:8002", "127.0.5.9:8002"),
        ("localhost:9090", "127.0.5.9:9090"),
        ("http://127.0.0.1:8001", "http://127.0.5.9:8001"),
        ("--storage.tsdb.path=/prometheus", "--storage.tsdb.path=/run/data"),
        ("/etc/prometheus/rules/*.yml", "/run/rules/*.yml"),
        ("/etc/prometheus/prometheus.yml", "/etc/prometheus/prometheus.yml"),
    ],
)
def test_rewriter_maps_names_binds_and_mounts(text: str, want: str) -> None:
    """Names become addresses only before :PORT; local and wildcard hosts become the unit's
    own address; a path under a mount point becomes the run's copy, other paths stay."""
    assert Rewriter("127.0.5.9", NAMES, MOUNTS)(text) == want


def test_vllm_keeps_every_flag_but_the_model_and_binds_its_address(tmp_path: Path) -> None:
    """vLLM runs the manifest's flags in order, the tiny model in place of --model, and on the
    unit's address when the manifest names no --host."""
    argv = ["--model", "Qwen/Qwen2.5-1.5B-Instruct", "--port", "8000", "--max-num-seqs", "64"]
    cmd = vllm_argv(argv, "127.0.5.2", tmp_path)
    assert cmd[2:] == ["serve", str(tmp_path), "--port", "8000", "--max-num-seqs", "64",
                       "--host", "127.0.5.2"]  # fmt: skip
    assert vllm_argv(["--host", "127.0.5.7"], "127.0.5.2", tmp_path)[-2:] == ["--host", "127.0.5.7"]


def test_units_take_loopback_addresses_in_order() -> None:
    """Units get the network's usable addresses in the manifest's order; a network that is not
    loopback, or too small, is refused with the option's name."""
    units = [Unit(name, "service", []) for name in ("a", "b", "c")]
    assert addresses(units, "127.0.5.0/29") == {
        "a": "127.0.5.1",
        "b": "127.0.5.2",
        "c": "127.0.5.3",
    }
    with pytest.raises(ConfigError, match=r"--network 10\.0\.0\.0/24: give a loopback range"):
        addresses(units, "10.0.0.0/24")
    with pytest.raises(ConfigError, match="3 units need as many addresses"):
        addresses(units, "127.0.5.0/31")
