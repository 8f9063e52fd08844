"""The simulator's tokenizer and its output text: words, not a model's vocabulary.

A token is a run of at most four letters or digits, or a punctuation mark
(``\\w{1,4}|[^\\w\\s]``: about four characters per token on English, as the load
generator plans its lengths), its id a CRC-32 of the text: enough for token counts that
grow with the prompt and for prefix caching that sees two prompts with the same leading
words as the same blocks. The output is a fixed cycle of words, one per token, so a
reply of ``n`` tokens is always the same.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from typing import Final

_TOKEN = re.compile(r"\w{1,4}|[^\w\s]")
WORDS: Final = ("sim", "ulated", " token", "s", " flow", " from", " a", " model", ",", " not", " a")
WORDS_CYCLE: Final = len(WORDS)


def token_ids(text: str) -> list[int]:
    return [zlib.crc32(t.encode()) for t in _TOKEN.findall(text)]


def block_hashes(ids: Sequence[int], block_size: int) -> list[int]:
    """The hash of each full block of ``ids``, chained: a block's hash covers all before it."""
    out, parent = [], 0
    for start in range(0, len(ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(ids[start : start + block_size])))
        out.append(parent)
    return out


def output_text(start: int, end: int) -> str:
    """The text of output tokens ``start`` to ``end`` (exclusive)."""
    return "".join(WORDS[i % WORDS_CYCLE] for i in range(start, end))
