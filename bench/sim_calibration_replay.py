"""The closed-loop replay of a benchmark client (bench/sim_calibration.py's ``closed`` kind).

``C`` clients each send the next request as soon as their last one finished, as ``vllm bench
serve --max-concurrency C`` and a semaphore of ``C`` over a prompt list both do. Without a
:class:`PromptSet` every prompt is random text (no prefix-cache hits). Since round 6 a case
may give the source's own prompt list (:class:`PromptSet`: which distinct prompt each
request sends, in the client's order) and the client's warm-up (``Case.warmup_rounds``:
ree2raz/inference-bench's ``run_benchmark_impl`` first sends ``prompts[:2 * C]`` at the
same concurrency and waits for them, then measures): a prompt then carries block hashes,
so a repeated prompt, or the shared head of two, finds its blocks in the simulated prefix
cache (obs/engines/sim/kvcache.py, vLLM V1's block-hash reuse), as the real server's did.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from obs.engines.sim.scheduler import SimRequest
from obs.sweep.virtual import VirtualLoop, VirtualReplica

if TYPE_CHECKING:
    from bench.sim_calibration_cases import Case

BLOCK_TOKENS = 16  # vLLM's default --block-size, the simulated replica's too


@dataclass(frozen=True, slots=True)
class PromptSet:
    """A source's own prompts: ``lengths[k]`` tokens for distinct prompt ``k``, ``order``
    the distinct prompt each request of the list sends, and ``head`` leading tokens every
    prompt shares (its chat template and common opening)."""

    lengths: tuple[int, ...]
    order: tuple[int, ...]
    head: int = 0

    def __post_init__(self) -> None:
        if not self.order or any(not 0 <= k < len(self.lengths) for k in self.order):
            raise ValueError("a prompt set's order names each request's distinct prompt")
        if any(n < 1 for n in self.lengths) or self.head < 0:
            raise ValueError("a prompt has at least one token and the shared head none or more")

    def block_hashes(self, k: int) -> tuple[int, ...]:
        """The hashes of distinct prompt ``k``'s full blocks: a block inside the shared head
        is the same in every prompt, any later one is prompt ``k``'s own (vLLM chains each
        block's hash to the blocks before it, so a block after a difference never matches)."""
        shared = min(self.head, self.lengths[k]) // BLOCK_TOKENS
        full = self.lengths[k] // BLOCK_TOKENS
        return tuple(i if i < shared else (k + 1) * 1_000_000 + i for i in range(full))

    def request(self, rid: str, i: int, max_tokens: int) -> SimRequest:
        """The ``i``-th request of the list (its distinct prompt, cached blocks and all)."""
        if i >= len(self.order):
            raise ValueError(f"the prompt list has {len(self.order)} prompts, not {i + 1}")
        k = self.order[i]
        return SimRequest(rid, self.lengths[k], max_tokens, self.block_hashes(k))


def closed(loop: VirtualLoop, replica: VirtualReplica, case: Case, done: list[SimRequest]) -> None:
    """Replay ``case``'s closed loop on ``replica``; the measured requests go to ``done``
    (a warm-up's do not)."""
    rng = random.Random(f"calibration:{case.name}")
    draw = output_lengths(case.output_tokens, case.mean_output, rng)
    warmup = case.warmup_rounds * case.concurrency
    if case.prompt_set is not None:  # the client's prompts[:n] of a shorter list: all of it
        warmup = min(warmup, len(case.prompt_set.order))
    if warmup:
        loop.run_until_complete(_clients(replica, case, range(warmup), draw, []))
    loop.run_until_complete(_clients(replica, case, range(case.prompts), draw, done))


async def _clients(
    replica: VirtualReplica,
    case: Case,
    items: Sequence[int],
    draw: Callable[[], int],
    done: list[SimRequest],
) -> None:
    counter = itertools.count()
    prompts = case.prompt_set

    async def client() -> None:
        while (n := next(counter)) < len(items):
            i = items[n]
            req = (
                prompts.request(f"c{i}", i, draw())
                if prompts is not None
                else SimRequest(f"c{i}", case.input_tokens, draw())
            )
            await replica.submit(req)
            done.append(req)

    await asyncio.gather(*(client() for _ in range(case.concurrency)))


def output_lengths(cap: int, mean: float, rng: random.Random) -> Callable[[], int]:
    """Answer lengths of a run with ``max_tokens = cap``: all ``cap`` (``--ignore-eos``), or,
    given the run's published mean (output tokens / requests), the model ending at each
    token with one fixed chance (end of sequence), capped at ``cap``, that chance solved
    so the mean is the published one."""
    if not mean or mean >= cap:
        return lambda: cap
    low, high = 1e-9, 1.0  # the chance of ending at a token; the capped mean falls with it
    for _ in range(60):
        p = (low + high) / 2
        capped_mean = (1 - (1 - p) ** cap) / p
        low, high = (p, high) if capped_mean > mean else (low, p)
    p = (low + high) / 2

    def draw() -> int:
        n = 1
        while n < cap and rng.random() >= p:
            n += 1
        return n

    return draw


# ree2raz/inference-bench's prompts/workload.jsonl (at 621910011c, the commit round 5
# cites): its 100 "short" and 100 "long" chat prompts are 49 and 10 distinct ones, each
# ``order`` entry the distinct prompt the file's next line sends (first seen, first
# numbered). Tokens by round 5's rule: four characters a token plus Qwen2.5's 30 tokens of
# default system prompt and chat markers; the long prompts also share their first 60
# characters ("The following is an excerpt from a technical document about ").
_IB_SHORT_CHARS = (
    62, 58, 70, 63, 66, 62, 58, 59, 73, 58, 62, 67, 67, 63, 77, 59, 57, 75, 67, 73, 57, 65,
    59, 47, 61, 61, 68, 69, 76, 69, 69, 76, 70, 69, 54, 63, 57, 69, 78, 57, 59, 79, 59, 69,
    65, 54, 66, 79, 54,
)  # fmt: skip
_IB_SHORT_ORDER = (
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 4, 9, 12, 13, 7, 14, 15, 16, 17, 18, 19, 19, 20, 21,
    22, 23, 24, 25, 26, 27, 20, 28, 28, 29, 18, 30, 2, 31, 12, 32, 33, 34, 35, 6, 35, 36, 36,
    17, 34, 37, 33, 30, 38, 39, 40, 32, 15, 41, 3, 41, 0, 42, 42, 1, 21, 28, 39, 43, 38, 24,
    37, 16, 40, 44, 14, 27, 31, 29, 44, 25, 11, 8, 45, 46, 8, 13, 47, 5, 46, 48, 45, 43, 22,
    48, 26, 10, 47, 23,
)  # fmt: skip
_IB_LONG_CHARS = (9817, 9881, 9878, 9762, 10081, 9940, 9406, 9846, 9796, 9909)
_IB_LONG_ORDER = (
    0, 1, 2, 1, 3, 4, 5, 6, 7, 3, 6, 6, 4, 2, 1, 3, 4, 3, 3, 7, 8, 5, 0, 5, 1, 0, 7, 4, 5, 5,
    9, 6, 6, 2, 8, 1, 6, 9, 1, 3, 7, 8, 6, 0, 3, 5, 7, 5, 9, 5, 0, 4, 4, 2, 0, 1, 1, 9, 6, 0,
    2, 4, 8, 4, 6, 7, 3, 3, 9, 8, 9, 2, 0, 0, 3, 8, 8, 9, 5, 4, 8, 8, 6, 9, 5, 1, 8, 7, 0, 2,
    2, 1, 7, 9, 4, 7, 2, 9, 7, 2,
)  # fmt: skip
_CHAT = 30
IB_SHORT = PromptSet(tuple(round(n / 4) + _CHAT for n in _IB_SHORT_CHARS), _IB_SHORT_ORDER, _CHAT)
IB_LONG = PromptSet(
    tuple(round(n / 4) + _CHAT for n in _IB_LONG_CHARS), _IB_LONG_ORDER, 60 // 4 + _CHAT
)
IB_WARMUP_ROUNDS = 2  # bench_lib.py's run_benchmark_impl: warmup_prompts = prompts[:2 * C]
