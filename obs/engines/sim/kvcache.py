"""The simulated KV cache: N blocks of ``block_size`` tokens, with block-level prefix reuse.

As in vLLM V1: a request holds blocks; a full block of prompt tokens is registered
under the hash of its contents and everything before it, and a later request whose
prompt starts with the same blocks reuses them (a prefix-cache hit). A block nobody
holds any more stays cached but counts as free; it is evicted, least recently freed
first, when a new block is needed. Usage is ``1 - free / num_blocks``, the value of
``vllm:kv_cache_usage_perc``.

Blocks are counted, not numbered: a request's blocks are the hashed ones it holds
(``held``) and ``private`` ones that no other request can reuse (its output, a partial
last block, and prompt blocks whose hashes the caller did not give).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class Holding:
    """The blocks one request holds."""

    held: list[int] = field(default_factory=list)  # hashes of the cached blocks it holds
    private: int = 0

    @property
    def blocks(self) -> int:
        return len(self.held) + self.private


class KvCache:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("the KV cache needs at least one block of at least one token")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.empty = num_blocks
        self.refs: dict[int, int] = {}  # hash -> requests holding it (0: cached, evictable)
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.query_tokens = 0  # prompt tokens looked up (vllm:prefix_cache_queries_total)
        self.hit_tokens = 0  # of those, found cached (vllm:prefix_cache_hits_total)

    @property
    def free(self) -> int:
        return self.empty + len(self.evictable)

    @property
    def usage(self) -> float:
        return 1.0 - self.free / self.num_blocks

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def lookup(self, hashes: Sequence[int], prompt_tokens: int) -> int:
        """How many leading blocks of a prompt are cached (at most those before the
        prompt's last token, which is always computed)."""
        if not self.prefix_caching:
            return 0
        limit = min(len(hashes), (prompt_tokens - 1) // self.block_size)
        n = 0
        while n < limit and hashes[n] in self.refs:
            n += 1
        return n

    def count(self, prompt_tokens: int, hit_blocks: int) -> None:
        """A prompt was scheduled after its lookup: count it in the prefix-cache counters."""
        if self.prefix_caching:
            self.query_tokens += prompt_tokens
            self.hit_tokens += hit_blocks * self.block_size

    def acquire(self, holding: Holding, hashes: Sequence[int]) -> None:
        """Take the cached blocks ``hashes`` (found by :meth:`lookup`) into ``holding``."""
        for h in hashes:
            n = self.refs[h]
            if n == 0:
                del self.evictable[h]
            self.refs[h] = n + 1
            holding.held.append(h)

    def grow(self, holding: Holding, tokens: int) -> bool:
        """Give ``holding`` blocks for ``tokens`` tokens in all; False if the cache is full."""
        need = self.blocks_for(tokens) - holding.blocks
        if need <= 0:
            return True
        if need > self.free:
            return False
        while self.empty < need:
            h, _ = self.evictable.popitem(last=False)
            del self.refs[h]
            self.empty += 1
        self.empty -= need
        holding.private += need
        return True

    def register(self, holding: Holding, hashes: Sequence[int], computed: int) -> None:
        """Publish the full prompt blocks computed so far under their hashes."""
        if not self.prefix_caching:
            return
        full = min(len(hashes), computed // self.block_size)
        for i in range(len(holding.held), full):
            h = hashes[i]
            holding.private -= 1
            n = self.refs.get(h)
            if n is None:
                self.refs[h] = 1
            else:  # another request computed the same block meanwhile: keep one copy
                if n == 0:
                    del self.evictable[h]
                self.refs[h] = n + 1
                self.empty += 1
            holding.held.append(h)

    def release(self, holding: Holding) -> None:
        """The request finished or was preempted: its blocks go back (hashed ones stay
        cached, evictable)."""
        for h in reversed(holding.held):  # the tail of a prompt is evicted first
            n = self.refs[h] - 1
            self.refs[h] = n
            if n == 0:
                self.evictable[h] = None
        self.empty += holding.private
        holding.held.clear()
        holding.private = 0
