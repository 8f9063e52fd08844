"""A model from its Hugging Face ``config.json`` and a GPU from a small spec file.

The simulator's named models and GPUs (obs.engines.sim.hardware's ``MODELS`` and ``GPUS``)
are presets; any other is read from a file:

- **a model** from the ``config.json`` of its Hugging Face repository: the layers, hidden
  size, attention and KV heads (and ``head_dim``), the MLP's intermediate size, the
  vocabulary, and for a mixture of experts the routed experts (``num_local_experts``,
  ``num_experts`` or ``n_routed_experts``), the experts per token
  (``num_experts_per_tok``), their intermediate size (``moe_intermediate_size``) and the
  shared experts and dense layers (``n_shared_experts``, ``shared_expert_intermediate_size``,
  ``first_k_dense_replace``, ``mlp_only_layers``, ``decoder_sparse_step``); multi-head
  latent attention (``kv_lora_rank``) keeps its compressed cache. A multimodal config's
  ``text_config`` is read. Parameters are counted from the shapes (gated MLPs, the
  embeddings twice unless ``tie_word_embeddings``);
- **a GPU** from a YAML or JSON file of five numbers, from its vendor's data sheet (dense,
  no sparsity)::

      name: my-gpu
      bf16_tflops: 989            # dense BF16 tensor TFLOP/s
      fp8_tflops: 1979            # dense FP8 TFLOP/s (0 or absent: no FP8 tensor cores)
      memory_bandwidth_tbps: 3.35 # HBM TB/s
      memory_gib: 79.6            # memory the driver reports, GiB
      interconnect_gbps: 450      # GB/s one GPU sends a peer (NVLink; PCIe 4.0 x16: 32)

Every error is a :class:`ConfigError` naming the file and the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from obs.engines.sim.hardware import GIB, Gpu, Model
from obs.errors import ConfigError

GPU_FIELDS = {
    "bf16_tflops": "dense BF16 tensor TFLOP/s",
    "memory_bandwidth_tbps": "memory bandwidth, TB/s",
    "memory_gib": "memory, GiB",
}
GPU_OPTIONAL = {"fp8_tflops": 0.0, "interconnect_gbps": 32.0}


def looks_like_path(text: str) -> bool:
    """A ``--gpu`` or ``--model`` value that names a file rather than a preset."""
    return "/" in text or "\\" in text or text.endswith((".json", ".yaml", ".yml"))


def _read(path: Path, what: str) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{what} {path}: cannot read it ({e.strerror or e})") from e
    try:
        return yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
    except (ValueError, yaml.YAMLError) as e:
        raise ConfigError(f"{what} {path}: not valid {path.suffix[1:] or 'JSON'}: {e}") from e


def _number(doc: dict[str, Any], key: str, where: str, *, positive: bool = True) -> float:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: {key} must be a number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ConfigError(f"{where}: {key} must be {'positive' if positive else '>= 0'}")
    return float(value)


def load_gpu(path: Path) -> Gpu:
    """The GPU a spec file describes (module docstring)."""
    doc = _read(path, "--gpu")
    where = f"--gpu {path}"
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: give a mapping of {', '.join(GPU_FIELDS)}")
    missing = [f"{k} ({about})" for k, about in GPU_FIELDS.items() if k not in doc]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}")
    unknown = set(doc) - set(GPU_FIELDS) - set(GPU_OPTIONAL) - {"name"}
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    extra = {k: _number(doc, k, where, positive=False) for k in GPU_OPTIONAL if k in doc}
    return Gpu(
        str(doc.get("name") or path.stem),
        _number(doc, "bf16_tflops", where) * 1e12,
        _number(doc, "memory_bandwidth_tbps", where) * 1e12,
        _number(doc, "memory_gib", where) * GIB,
        extra.get("fp8_tflops", GPU_OPTIONAL["fp8_tflops"]) * 1e12,
        (extra.get("interconnect_gbps") or GPU_OPTIONAL["interconnect_gbps"]) * 1e9,
    )


def _int(doc: dict[str, Any], where: str, *keys: str, default: int | None = None) -> int:
    for key in keys:
        value = doc.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{where}: {key} must be a positive integer, got {value!r}")
        return value
    if default is None:
        raise ConfigError(f"{where}: no {' or '.join(keys)} (is it a model's config.json?)")
    return default


def _moe_layers(doc: dict[str, Any], layers: int) -> int:
    """How many of the layers route to experts (the rest have a dense MLP)."""
    dense_first = doc.get("first_k_dense_replace") or 0
    only = doc.get("mlp_only_layers") or []
    step = doc.get("decoder_sparse_step") or 1
    return sum(
        1
        for i in range(layers)
        if i >= dense_first and i not in only and (i + 1) % max(1, int(step)) == 0
    )


def load_model(path: Path) -> Model:
    """The model a Hugging Face ``config.json`` describes (module docstring)."""
    doc = _read(path, "--model-config")
    where = f"--model-config {path}"
    if isinstance(doc, dict) and "num_hidden_layers" not in doc:
        doc = doc.get("text_config") or doc
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: not a model's config.json (no mapping)")
    layers = _int(doc, where, "num_hidden_layers", "n_layer")
    hidden = _int(doc, where, "hidden_size", "n_embd")
    heads = _int(doc, where, "num_attention_heads", "n_head")
    kv_heads = _int(doc, where, "num_key_value_heads", default=heads)
    head_dim = _int(doc, where, "head_dim", default=hidden // heads)
    inter = _int(doc, where, "intermediate_size", default=4 * hidden)
    vocab = _int(doc, where, "vocab_size")
    if doc.get("kv_lora_rank"):  # multi-head latent attention (DeepSeek-V2/V3)
        rank = _int(doc, where, "kv_lora_rank")
        rope = _int(doc, where, "qk_rope_head_dim")
        nope = _int(doc, where, "qk_nope_head_dim")
        v_dim = _int(doc, where, "v_head_dim")
        q_rank = doc.get("q_lora_rank") or 0
        q = (
            hidden * q_rank + q_rank * heads * (nope + rope)
            if q_rank
            else hidden * heads * (nope + rope)
        )
        attention = (
            q + hidden * (rank + rope) + rank * heads * (nope + v_dim) + heads * v_dim * hidden
        )
        kv_heads, kv_per_layer = 1, rank + rope  # one latent cache, kept whole on every GPU
    else:
        attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
        kv_per_layer = 0
    experts = _int(doc, where, "num_local_experts", "num_experts", "n_routed_experts", default=0)
    per_token = _int(doc, where, "num_experts_per_tok", default=0) if experts else 0
    moe_layers = _moe_layers(doc, layers) if experts else 0
    expert_params = 0.0
    mlp = 3.0 * hidden * inter * (layers - moe_layers)  # gated MLPs: gate, up, down
    if moe_layers:
        if not per_token or per_token > experts:
            raise ConfigError(f"{where}: num_experts_per_tok must be 1..{experts}")
        e_inter = _int(doc, where, "moe_intermediate_size", default=inter)
        expert_params = moe_layers * experts * 3.0 * hidden * e_inter
        shared = doc.get("shared_expert_intermediate_size") or (
            (doc.get("n_shared_experts") or 0) * e_inter
        )
        mlp += moe_layers * (3.0 * hidden * shared + hidden * experts) + expert_params
    tied = bool(doc.get("tie_word_embeddings", False))
    params = layers * attention + mlp + vocab * hidden * (1 if tied else 2)
    context = _int(doc, where, "max_position_embeddings", default=32768)
    name = str(doc.get("_name_or_path") or path.parent.name or path.stem)
    return Model(
        name, params, layers, hidden, kv_heads, head_dim, context,
        experts=experts if moe_layers else 0,
        experts_per_token=per_token if moe_layers else 0,
        expert_params=expert_params,
        kv_per_layer=kv_per_layer,
    )  # fmt: skip
