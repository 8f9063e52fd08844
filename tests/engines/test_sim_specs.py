"""Any model and GPU for the simulator: a Hugging Face config.json and a GPU spec file."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from obs.engines.sim.hardware import GPUS, MODELS, StepWork, perf_model
from obs.engines.sim.specs import load_gpu, load_model
from obs.errors import ConfigError

# Shapes from each model's published config.json on Hugging Face (the fields the loader reads).
LLAMA_8B = {
    "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
    "max_position_embeddings": 131072, "tie_word_embeddings": False,
}  # fmt: skip
MIXTRAL_8X7B = {
    "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
    "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 32768,
}  # fmt: skip
QWEN3_30B_A3B = {
    "num_hidden_layers": 48, "hidden_size": 2048, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "vocab_size": 151936, "num_experts": 128,
    "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
}  # fmt: skip
DEEPSEEK_V3 = {
    "num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128,
    "num_key_value_heads": 128, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "vocab_size": 129280, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
}  # fmt: skip
H100_SPEC = (
    "name: my-h100\nbf16_tflops: 989\nfp8_tflops: 1979\nmemory_bandwidth_tbps: 3.35\n"
    "memory_gib: 79.6\ninterconnect_gbps: 450\n"
)


def _config(tmp_path: Path, name: str, doc: Mapping[str, object]) -> Path:
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("doc", "total", "active"),
    [
        (LLAMA_8B, 8.03e9, 8.03e9),  # the model card: 8.03 B
        (MIXTRAL_8X7B, 46.7e9, 12.9e9),  # Mistral's announcement: 46.7 B, 12.9 B per token
        (QWEN3_30B_A3B, 30.5e9, 3.3e9),  # the model card: 30.5 B, 3.3 B activated
        (DEEPSEEK_V3, 671e9, 37e9),  # the technical report: 671 B, 37 B per token
    ],
)
def test_a_config_json_counts_the_published_parameters(
    tmp_path: Path, doc: dict[str, object], total: float, active: float
) -> None:
    """Parameters counted from config.json's shapes match each model's published total and
    active (per token) counts within 2%."""
    m = load_model(_config(tmp_path, "m", doc))
    assert m.params == pytest.approx(total, rel=0.02)
    assert m.active_params == pytest.approx(active, rel=0.02)


def test_a_config_gives_the_preset_models_step_time(tmp_path: Path) -> None:
    """Llama-3.1-8B from its config.json times a step as the named preset does (within 1%)."""
    named = perf_model("H100", "llama-3.1-8b")
    loaded = perf_model("H100", str(_config(tmp_path, "llama", LLAMA_8B)))
    work = StepWork(tokens=64, attention_pairs=64 * 500, kv_read_tokens=64 * 500, seqs=64,
                    decode_kv_tokens=64 * 500)  # fmt: skip
    assert loaded.step_seconds(work) == pytest.approx(named.step_seconds(work), rel=0.01)
    assert loaded.kv_bytes_per_token == named.kv_bytes_per_token


def test_a_moe_step_reads_more_experts_as_its_batch_grows(tmp_path: Path) -> None:
    """A mixture of experts computes only its active parameters per token, but a bigger batch
    reaches more experts, so its weight read grows from the active share toward all of them."""
    m = load_model(_config(tmp_path, "mixtral", MIXTRAL_8X7B))
    assert m.read_params(1) == pytest.approx(m.active_params, rel=1e-9)
    assert m.active_params < m.read_params(4) < m.read_params(64) <= m.params
    assert m.read_params(64) == pytest.approx(m.params, rel=1e-3)


def test_mla_keeps_one_latent_cache_per_layer(tmp_path: Path) -> None:
    """Multi-head latent attention caches kv_lora_rank + rope elements per token and layer,
    not two per head; on 8 GPUs each keeps the whole latent cache."""
    m = load_model(_config(tmp_path, "dsv3", DEEPSEEK_V3))
    perf = perf_model("H200", m, tp=8, weights="fp8")
    assert perf.kv_bytes_per_token == 61 * (512 + 64) * 2


def test_a_gpu_spec_file_is_a_gpu(tmp_path: Path) -> None:
    """A spec file's five numbers make the GPU the preset of the same data sheet is."""
    spec = tmp_path / "h100.yaml"
    spec.write_text(H100_SPEC, encoding="utf-8")
    gpu = load_gpu(spec)
    h100 = GPUS["H100"]
    assert gpu.name == "my-h100"
    assert (gpu.flops, gpu.fp8_flops, gpu.bandwidth, gpu.link_bandwidth) == (
        h100.flops, h100.fp8_flops, h100.bandwidth, h100.link_bandwidth,
    )  # fmt: skip
    assert gpu.memory_bytes == pytest.approx(h100.memory_bytes, rel=1e-3)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bf16_tflops: 989\nmemory_gib: 80\n", "missing memory_bandwidth_tbps"),
        (H100_SPEC + "sparsity: 2\n", "unknown field(s) sparsity"),
        (H100_SPEC.replace("989", "-1"), "bf16_tflops must be positive"),
        ("- 1\n", "give a mapping"),
    ],
)
def test_a_bad_gpu_spec_says_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    """A spec file with a missing, unknown or bad field is refused, naming it."""
    spec = tmp_path / "bad.yaml"
    spec.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_gpu(spec)


def test_a_file_that_is_not_a_model_config_is_refused(tmp_path: Path) -> None:
    """A config.json without the layers (another file) is refused, saying what it lacks."""
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        load_model(_config(tmp_path, "x", {"hello": 1}))


def test_the_presets_include_the_parts_operators_run_now() -> None:
    """H200, B200, L40S and MI300X are presets beside the earlier GPUs, each runnable."""
    for name in ("H200", "B200", "L40S", "MI300X"):
        assert perf_model(name, "llama-3.1-8b").kv_blocks(16) > 0
    assert set(MODELS) >= {"llama-3.1-8b", "llama-3.1-70b"}


@pytest.mark.process
def test_the_command_refuses_an_unknown_gpu_with_a_message(tmp_path: Path) -> None:
    """`engine sim --gpu NAME` of no preset and no file exits 2 with the presets listed."""
    r = subprocess.run(
        [sys.executable, "-m", "obs.cli", "engine", "sim", "--gpu", "Z9000", "--port", "1"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "Z9000" in r.stderr and "MI300X" in r.stderr and "spec file" in r.stderr


@pytest.mark.process
def test_a_moe_model_from_its_config_serves_a_streamed_request(tmp_path: Path) -> None:
    """`engine sim --model-config` (Mixtral's config.json) on a GPU from a spec file serves a
    streamed chat through the real openai client, under the config's folder name."""
    import httpx
    import openai

    from obs.engines.sim.process import SimServer

    config = _config(tmp_path, "mixtral-8x7b", MIXTRAL_8X7B)
    spec = tmp_path / "gpu.yaml"
    spec.write_text(H100_SPEC, encoding="utf-8")
    args = ["--model-config", str(config), "--gpu", str(spec), "--tensor-parallel-size", "2"]
    with SimServer([*args, "--speed", "20"]) as sim:
        with openai.OpenAI(base_url=sim.url + "/v1", api_key="none", max_retries=0) as client:
            stream = client.chat.completions.create(
                model="mixtral-8x7b",
                messages=[{"role": "user", "content": "hello"}],
                stream=True,
                max_tokens=8,
            )
            chunks = [c for c in stream if c.choices]
        version = httpx.get(sim.url + "/version").json()
    assert sum(bool(c.choices[0].delta.content) for c in chunks) >= 1
    assert chunks[-1].choices[0].finish_reason == "length"
    assert version == {"version": "sim-my-h100-mixtral-8x7b"}


def test_engine_sim_runs_with_a_host_calibration(tmp_path: Path) -> None:
    """`engine sim --calibration FILE` serves with the file's corrections (the rest built in);
    a file that is not a host calibration is refused, saying how to make one."""
    import argparse

    from obs.engines.sim import cli as sim_cli
    from obs.engines.sim.calibration import calibration_doc
    from obs.engines.sim.hardware import CALIBRATION

    parser = argparse.ArgumentParser()
    sim_cli.add_parser(parser.add_subparsers())
    host = tmp_path / "host.json"
    checked = {"points": 3, "median_abs_error": 0.1, "max_abs_error": 0.2}
    doc = calibration_doc(CALIBRATION.__class__(mbu=0.6), {}, checked)
    host.write_text(json.dumps(doc), encoding="utf-8")
    opts = sim_cli.options(parser.parse_args(["sim", "--calibration", str(host)]))
    assert opts.perf is not None and opts.perf.cal.mbu == 0.6
    assert opts.perf.cal.step_s == CALIBRATION.step_s
    bad = tmp_path / "bad.json"
    bad.write_text("{}", encoding="utf-8")
    with pytest.raises(ConfigError, match="engine sim check --fit"):
        sim_cli.options(parser.parse_args(["sim", "--calibration", str(bad)]))
