"""Build a tiny random-weight Llama model in GGUF for ``llama-server``.

Run as a script with an interpreter that has the ``gguf`` package (and numpy):
``python tiny_gguf.py OUT.gguf --seed 0``. Two layers, 64-wide, a byte-level
SentencePiece-style vocabulary (``<unk>``, ``<s>``, ``</s>`` and the 256 byte
tokens, so any text tokenizes) and a ChatML chat template: it loads in well
under a second and answers ``/v1/chat/completions`` with random tokens.
"""

from __future__ import annotations

import argparse
from pathlib import Path

N_EMBD = 64
N_LAYERS = 2
N_HEADS = 4
N_FF = 128
CONTEXT = 2048
SPECIAL = ("<unk>", "<s>", "</s>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build(out: Path, seed: int) -> None:
    import gguf  # the builder's interpreter has it; the caller's need not
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens = [t.encode() for t in SPECIAL] + [f"<0x{b:02X}>".encode() for b in range(256)]
    types = [
        gguf.TokenType.UNKNOWN,
        gguf.TokenType.CONTROL,
        gguf.TokenType.CONTROL,
        *[gguf.TokenType.BYTE] * 256,
    ]
    vocab = len(tokens)

    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name("vllm-obs tiny llama")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYERS)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEADS)
    w.add_head_count_kv(N_HEADS)
    w.add_rope_dimension_count(N_EMBD // N_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * vocab)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_chat_template(CHAT_TEMPLATE)

    def tensor(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    tensor("token_embd.weight", vocab, N_EMBD)
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    tensor("output.weight", vocab, N_EMBD)
    for i in range(N_LAYERS):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensor(f"blk.{i}.{part}.weight", N_EMBD, N_EMBD)
        tensor(f"blk.{i}.ffn_gate.weight", N_FF, N_EMBD)
        tensor(f"blk.{i}.ffn_up.weight", N_FF, N_EMBD)
        tensor(f"blk.{i}.ffn_down.weight", N_EMBD, N_FF)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="GGUF file to write (must not exist)")
    parser.add_argument("--seed", type=int, default=0, help="weights seed (default: 0)")
    args = parser.parse_args()
    if args.out.exists():
        parser.error(f"{args.out} already exists")
    build(args.out, args.seed)


if __name__ == "__main__":
    main()
