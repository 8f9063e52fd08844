"""The sidecar's peers (issue 8) as relay-benchmark targets, installed on first use.

Each peer gets its own virtual environment under the engine's home
(``~/.cache/vllm-obs/peer-NAME``), pinned, and reinstalled only when its
requirements change (a marker file, as for the engine venv). It then runs as
a subprocess on a free loopback port in front of the fake vLLM, stopped by PID:

  litellm      the LiteLLM proxy, one worker, model ``tiny`` forwarded to the fake
               as an OpenAI-compatible vLLM deployment; no database, no Redis
  vllm-router  vLLM's Rust router, one worker URL: the fake, its default
               (cache-aware) policy, Prometheus metrics on (not scraped)

LiteLLM re-frames the stream: a chunk of its own for ``finish_reason``, and
its usage chunk carries a ``choices`` entry, which ``vllm bench serve`` takes
for a token chunk. The client then counts output tokens by re-tokenising the
text (about 7% more than the fake sent) and sees two more gaps per request.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.procs import Server
from obs.engines.setup import engine_environment, engine_home, locked, read_json, run_logged
from obs.procs import free_port

MODEL = "tiny"  # the name `vllm bench serve` sends (bench/vllm_bench.py) and the fake serves
_MARKER = ".vllm-obs-peer.json"
_PIP_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Peer:
    """A reference proxy: its pinned requirements and the module whose import proves them."""

    name: str
    requirements: tuple[str, ...]
    probe: str


LITELLM = Peer("litellm", ("litellm[proxy]==1.102.4",), "litellm.proxy.proxy_server")
VLLM_ROUTER = Peer("vllm-router", ("vllm-router==0.1.17",), "vllm_router")
PEERS = {p.name: p for p in (LITELLM, VLLM_ROUTER)}


def peer_venv(peer: Peer) -> Path:
    """Where ``peer`` is installed: ``peer-NAME`` beside the engine venv."""
    return engine_home() / f"peer-{peer.name}"


def ensure_peer(peer: Peer, progress: Callable[[str], None]) -> Path:
    """Install ``peer`` into its venv unless its marker matches; return the venv's bin dir."""
    venv = peer_venv(peer)
    bin_dir = venv / "bin"
    spec = {
        "requirements": list(peer.requirements),
        "base_python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }
    venv.parent.mkdir(parents=True, exist_ok=True)
    with locked(venv.parent / f".peer-{peer.name}.lock"):
        if (bin_dir / "python").exists() and read_json(venv / _MARKER) == spec:
            progress(f"{peer.name}: ready at {venv} ({' '.join(peer.requirements)})")
            return bin_dir
        logs = venv.parent / "logs"
        python = str(bin_dir / "python")
        progress(
            f"{peer.name}: first use: installing {' '.join(peer.requirements)} into {venv} "
            f"(can take a minute; logs {logs}/peer-{peer.name}-*.log) ..."
        )
        t0 = time.monotonic()
        steps = {
            "venv": [sys.executable, "-m", "venv", "--clear", str(venv)],
            "pip": [python, "-m", "pip", "install", "--no-input", *peer.requirements],
            "import": [python, "-c", f"import {peer.probe}"],
        }
        for step, cmd in steps.items():
            log = logs / f"peer-{peer.name}-{step}.log"
            run_logged(cmd, log, what=f"{peer.name}: {step}", timeout_s=_PIP_TIMEOUT_S)
            progress(f"{peer.name}: {step}: done at {time.monotonic() - t0:.0f} s")
        (venv / _MARKER).write_text(json.dumps(spec, indent=2) + "\n")
        progress(f"{peer.name}: installed in {time.monotonic() - t0:.0f} s")
    return bin_dir


LITELLM_CONF = """\
model_list:
  - model_name: {model}
    litellm_params:
      model: hosted_vllm/{model}
      api_base: {api_base}
      api_key: dummy
"""


class LiteLlm(Server):
    """The LiteLLM proxy (uvicorn, one worker) with one vLLM deployment: the fake."""

    def __init__(self, work: Path, bin_dir: Path, upstream: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        conf = work / "litellm.yaml"
        conf.write_text(LITELLM_CONF.format(model=MODEL, api_base=upstream + "/v1"))
        cmd = [str(bin_dir / "litellm"), "--config", str(conf), "--num_workers", "1"]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port)]
        # Its model cost map is fetched from the internet at import unless read from the package.
        env = {**engine_environment(os.environ), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        health = self.url + "/health/liveliness"  # /health calls every model
        super().__init__("litellm", cmd, work / "litellm.log", health, env=env, start_timeout_s=120)


class VllmRouter(Server):
    """vLLM's Rust router with one worker (the fake), default policy, metrics on a free port."""

    def __init__(self, work: Path, bin_dir: Path, upstream: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [str(bin_dir / "vllm-router"), "--worker-urls", upstream]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
        cmd += ["--worker-startup-check-interval", "1"]  # default 30 s between worker checks
        env = engine_environment(os.environ)
        health = self.url + "/readiness"  # 200 once its worker is healthy
        super().__init__("vllm-router", cmd, work / "vllm-router.log", health, env=env)


def start_peer(
    name: str, work: Path, upstream: str, progress: Callable[[str], None]
) -> LiteLlm | VllmRouter:
    """Install peer ``name`` if needed, start it in front of ``upstream`` and wait for it."""
    bin_dir = ensure_peer(PEERS[name], progress)
    cls = LiteLlm if name == LITELLM.name else VllmRouter
    server = cls(work, bin_dir, upstream)
    t0 = time.monotonic()
    server.start()
    progress(f"{name}: started in {time.monotonic() - t0:.1f} s (log {server.log_path})")
    return server
