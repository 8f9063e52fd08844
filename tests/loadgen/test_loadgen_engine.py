"""The load generator against a real ``vllm serve`` (tiny model), directly and via the sidecar."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from obs.cli import main as cli_main
from obs.engines.server import VllmServer
from obs.loadgen.check import check_files
from obs.loadgen.mix import CLASS_NAMES
from obs.loadgen.records import Record, read_records
from tests.conftest import SidecarFactory

pytestmark = pytest.mark.engine

# Every class, shaped to fit the tiny model's 2048-token context (its tokenizer makes
# about 1.15 tokens of the 4-characters-per-token estimate).
TINY_MIX = [
    *(f"{c}.weight=1" for c in CLASS_NAMES),
    "chat.prompt_tokens=[16,64]",
    "chat.max_tokens=[4,8]",
    "rag.documents=2",
    "rag.document_tokens=[400,500]",
    "rag.prompt_tokens=[8,16]",
    "rag.max_tokens=[4,8]",
    "long-prefill.prompt_tokens=[800,1000]",
    "long-prefill.max_tokens=4",
    "agent.context_tokens=[300,400]",
    "agent.turns=3",
    "agent.prompt_tokens=[16,32]",
    "agent.max_tokens=[4,8]",
    "agent.think_time_s=[0.05,0.1]",
    "batch.prompt_tokens=[300,500]",
    "batch.max_tokens=[16,32]",
    "slow-stream.prompt_tokens=[16,32]",
    "slow-stream.max_tokens=[16,24]",
    "slow-stream.read_bytes_per_s=20000",
]


def _load(url: str, out: Path, run_id: str, *extra: str) -> list[Record]:
    args = ["load", "--url", url, "--requests", "30", "--rate", "20", "--seed", "3"]
    args += ["--out", str(out), "--run-id", run_id, "--no-progress", *extra]
    args += [a for s in TINY_MIX for a in ("--set", s)]
    assert cli_main(args) == 0
    return sorted(read_records(out), key=lambda r: r.index)


def test_load_against_vllm_measures_every_class(vllm: VllmServer, tmp_path: Path) -> None:
    """Against real vLLM every class succeeds, tokens match usage, and shared prefixes hit."""
    records = _load(vllm.url, tmp_path / "records.jsonl", "eng")
    assert len(records) == 30 and set(Counter(r.client_class for r in records)) == set(CLASS_NAMES)
    for r in records:
        assert r.status == "ok" and r.http_status == 200, r
        assert r.model == vllm.served_model_name
        assert (r.completion_tokens, r.tokens_source) == (r.max_tokens, "usage")
        assert (r.ttft_ms is None) == (r.client_class == "batch")
        assert r.prompt_tokens is not None and r.prompt_tokens >= r.prompt_tokens_planned
    reused = [
        r for r in records if r.client_class == "rag" or (r.client_class == "agent" and r.turn)
    ]
    assert any((r.cached_tokens or 0) > 0 for r in reused)


def test_load_through_the_sidecar_matches_its_events(
    vllm: VllmServer, sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """Through the sidecar, every request has an event, with the same tokens and status."""
    proc = sidecar(vllm.url)
    assert proc.events_path is not None
    out = tmp_path / "records.jsonl"
    records = _load(proc.url, out, "side", "--check", str(proc.events_path))
    report = check_files(out, proc.events_path, wait_s=10)
    assert report.ok and report.matched == len(records) == 30
    assert report.token_mismatches == () and report.status_mismatches == ()
    streamed = [r for r in records if r.stream]
    assert report.ttft_diff_ms is not None and report.ttft_diff_ms.count == len(streamed)
    assert report.e2e_diff_ms is not None and report.e2e_diff_ms.count == 30
