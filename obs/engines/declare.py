"""What ``vllm-obs engine serve`` passed to ``vllm serve``, as a lanes config's engine block.

A pool declares the flags its replicas run with (``engine: {kind: vllm, max_num_seqs: 64}``,
``obs.config.DeclaredEngine``): vLLM reports none of its scheduler flags, so the sidecar's
settings series and fingerprints carry them only if declared. The launcher prints the block
for what it started, read from the arguments it passed (flag ``--max-num-seqs`` is setting
``max_num_seqs``; ``--[no-]enable-prefix-caching`` is ``prefix_caching``).
"""

from __future__ import annotations

from collections.abc import Sequence

import yaml

from obs.config_blocks import DeclaredEngine
from obs.numerals import whole_number

PREFIX_CACHING_FLAGS = {"--enable-prefix-caching": True, "--no-enable-prefix-caching": False}


def declared_flags(args: Sequence[str], max_model_len: int | None = None) -> DeclaredEngine:
    """The declared settings ``args`` (``vllm serve`` arguments) set; the last one given wins."""
    flags = {"--" + name.replace("_", "-"): name for name in DeclaredEngine.model_fields}
    values: dict[str, object] = {} if max_model_len is None else {"max_model_len": max_model_len}
    for i, arg in enumerate(args):
        flag, _, inline = arg.partition("=")
        if arg in PREFIX_CACHING_FLAGS:
            values["prefix_caching"] = PREFIX_CACHING_FLAGS[arg]
        elif flag in flags and flag != "--prefix-caching":
            value = inline or (args[i + 1] if i + 1 < len(args) else "")
            if (number := whole_number(value)) is not None:
                values[flags[flag]] = number
    return DeclaredEngine.model_validate(values)


def engine_block(declared: DeclaredEngine) -> str:
    """The one-line YAML ``engine:`` block a lanes config's pool declares these with."""
    block = {"kind": "vllm", **declared.values()}
    return "engine: " + yaml.safe_dump(block, default_flow_style=True, sort_keys=False).strip()
