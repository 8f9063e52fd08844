"""Build a tiny random-weight Llama model and tokenizer that ``vllm serve`` can load.

Run by the ENGINE venv's interpreter (it needs torch, tokenizers and transformers)::

    python tiny_model.py OUTDIR [--seed N]

No hub access: the tokenizer is a byte-level BPE trained on the interpreter's own
standard library, the weights are random. Given the same seed, interpreter and
package versions, the output files are byte-identical.
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
from pathlib import Path
from typing import Any

VOCAB_SIZE = 4096
TRAINING_FILES = 200
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")
BOS_TOKEN, _, EOS_TOKEN, PAD_TOKEN = SPECIAL_TOKENS
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def training_files(count: int = TRAINING_FILES) -> list[Path]:
    """The first ``count`` stdlib modules by relative path (tests and site-packages skipped)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    skipped = {"site-packages", "test", "tests"}
    files = sorted(
        (p for p in stdlib.rglob("*.py") if p.is_file() and not skipped & set(p.parts)),
        key=lambda p: p.relative_to(stdlib).as_posix(),
    )
    if len(files) < count:
        raise SystemExit(f"only {len(files)} .py files under {stdlib}; need {count}")
    return files[:count]


def build_tokenizer(files: list[Path]) -> Any:
    """Train a byte-level BPE tokenizer and wrap it for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )


def build_model(tokenizer: Any, seed: int) -> Any:
    """A 2-layer Llama with random bf16 weights, seeded."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS_TOKEN),
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS_TOKEN),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, help="directory to create for the model")
    parser.add_argument("--seed", type=int, default=0, help="seed for the random weights")
    args = parser.parse_args(argv)

    tokenizer = build_tokenizer(training_files())
    model = build_model(tokenizer, args.seed)
    args.out_dir.mkdir(parents=True, exist_ok=False)
    tokenizer.save_pretrained(args.out_dir)
    model.save_pretrained(args.out_dir)
    print(f"tiny model written to {args.out_dir}")
    return 0


if __name__ == "__main__":
    # Drop this script's directory from the path: it holds modules (setup, server, cli)
    # whose names could shadow packages of the engine venv.
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent]
    sys.exit(main())
