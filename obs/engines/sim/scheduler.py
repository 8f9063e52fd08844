"""The simulated engine's scheduler: vLLM V1's step loop over a waiting queue and a running batch.

Each step has a token budget (``--max-num-batched-tokens``). The running requests
come first, in arrival order: each gets the tokens it still needs (the rest of its
prompt, or one token while decoding), a prefill capped at
``--long-prefill-token-threshold`` and at the budget left (chunked prefill). When the
KV cache has no block for a request, the newest running request is preempted (its
blocks freed, its tokens recomputed later), as vLLM's recompute preemption does.
Then, if nothing was preempted, waiting requests join while the batch has fewer than
``--max-num-seqs`` sequences and budget is left; a waiting request first reuses the
cached blocks of its prompt's prefix. After a step, a request whose tokens are all
computed samples one output token; it finishes at ``max_tokens``. With
``mixed_steps`` off (vLLM V0) a step either prefills waiting prompts or decodes the running
ones, prompts first; with ``num_scheduler_steps`` N > 1 (vLLM 0.6's multi-step scheduling,
V0 only) a decode batch runs N steps per schedule, every sequence all N of them
(:meth:`Scheduler.lockstep`).

Pure and clock-free: the caller times each step (obs.engines.sim.hardware) and says
when it ended. ``decode_run`` lets a caller in virtual time advance many identical
decode-only steps at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from obs.engines.sim.hardware import StepWork
from obs.engines.sim.kvcache import Holding, KvCache


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The vLLM flags the scheduler obeys (vLLM's V1 defaults for an online server)."""

    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    long_prefill_token_threshold: int = 0  # 0: no cap below the budget
    chunked_prefill: bool = True
    mixed_steps: bool = True  # False: vLLM V0, a step prefills or decodes, prefills first
    # vLLM 0.6's --num-scheduler-steps (V0; V1 has none): decode steps per schedule.
    num_scheduler_steps: int = 1


GIB = 1 << 30


def vllm_defaults(
    gpu: str,
    memory_bytes: float,
    *,
    v1: bool = True,
    server: bool = True,
    max_model_len: int = 0,
    scheduler_steps: int = 1,
) -> SchedulerConfig:
    """The scheduler limits vLLM picks when ``--max-num-batched-tokens`` and
    ``--max-num-seqs`` are not given (docs/sim.md, "The scheduler", cites the source).

    V1 (the engine since 0.8; ``EngineArgs.get_batch_defaults``): on a GPU with at least
    70 GiB that is not an A100, 8192 tokens and 1024 sequences for the API server (16384
    for the offline ``LLM`` class); otherwise 2048 tokens and 256 sequences (8192 offline);
    chunked prefill always on. V0 (0.5-0.6): chunked prefill off for a context up to 32k,
    the budget then the larger of ``--max-model-len`` and 2048 (512 with chunked prefill),
    and 256 sequences; ``scheduler_steps`` is V0's ``--num-scheduler-steps``.
    """
    if not v1:
        context = max_model_len or 32768
        if context <= 32768:
            return SchedulerConfig(
                max(context, 2048),
                256,
                chunked_prefill=False,
                mixed_steps=False,
                num_scheduler_steps=scheduler_steps,
            )
        return SchedulerConfig(512, 256, num_scheduler_steps=scheduler_steps)  # chunked
    big = memory_bytes >= 70 * GIB and "a100" not in gpu.lower()
    if big:
        return SchedulerConfig(8192 if server else 16384, 1024)
    return SchedulerConfig(2048 if server else 8192, 256)


@dataclass(slots=True, eq=False)
class SimRequest:
    rid: str
    prompt_tokens: int
    max_tokens: int
    block_hashes: Sequence[int] = ()
    arrival_s: float = 0.0
    owner: object = None  # whoever waits for its tokens (the server's stream, the replay)
    computed: int = 0
    output: int = 0
    holding: Holding = field(default_factory=Holding)
    scheduled_s: float | None = None  # first scheduled (end of the engine queue)
    first_token_s: float | None = None
    finished_s: float | None = None
    preemptions: int = 0
    prompt_counted: bool = False
    cached_tokens: int = 0  # prompt tokens found in the prefix cache when first scheduled
    last_token_s: float | None = None  # when its latest token was sampled (its caller sets it)
    # Its inter-token gaps as (seconds, how many), kept by the virtual-time replica.
    gaps: list[tuple[float, int]] = field(default_factory=list)
    finish_reason: str = "length"  # at max_tokens: "length" if the client set it, else "stop"
    n: int = 1  # the HTTP request's n (its choices are requests of their own)

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.output

    @property
    def done(self) -> bool:
        return self.output >= self.max_tokens


@dataclass(slots=True)
class Batch:
    items: list[tuple[SimRequest, int]]
    work: StepWork
    preempted: list[SimRequest]

    @property
    def decode_only(self) -> bool:
        # A request whose prefix-cache hit left one prompt token is not decoding yet.
        return self.work.tokens == len(self.items) and all(
            r.output > 0 and r.computed + 1 == r.total for r, _ in self.items
        )


def _work(items: list[tuple[SimRequest, int]]) -> StepWork:
    tokens, pairs, read, decode = 0, 0.0, 0.0, 0.0
    for r, n in items:
        tokens += n
        pairs += n * (r.computed + n / 2)
        read += r.computed + n
        if n == 1 and r.output > 0:
            decode += r.computed + 1
    return StepWork(tokens, pairs, read, len(items), decode)


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KvCache) -> None:
        self.config = config
        self.kv = kv
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.preemptions = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, req: SimRequest) -> None:
        self.waiting.append(req)

    def abort(self, req: SimRequest) -> None:
        """Drop a request (its client left): its blocks go back."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.release(req.holding)

    def schedule(self, now: float = 0.0) -> Batch:
        """The next step's batch (possibly empty)."""
        cfg, kv = self.config, self.kv
        budget = cfg.max_num_batched_tokens
        items: list[tuple[SimRequest, int]] = []
        preempted: list[SimRequest] = []
        if not cfg.mixed_steps and self.waiting:
            # vLLM V0: waiting prompts get a step of their own; the decodes wait for it.
            self._admit(items, budget, now)
            if items:
                return Batch(items, _work(items), preempted)
        i = 0
        bs = kv.block_size
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = req.prompt_tokens + req.output - req.computed
            h = req.holding
            if n == 1 and req.computed < (len(h.held) + h.private) * bs:  # a decode with room
                items.append((req, 1))
                budget -= 1
                i += 1
                continue
            n = self._chunk(n, budget)
            while not kv.grow(req.holding, req.computed + n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    break
            else:
                items.append((req, n))
                budget -= n
                i += 1
        if not preempted and cfg.mixed_steps:
            self._admit(items, budget, now)
        return Batch(items, _work(items), preempted)

    def _admit(self, items: list[tuple[SimRequest, int]], budget: int, now: float) -> None:
        """Waiting requests join while fewer than --max-num-seqs run and budget is left."""
        cfg, kv = self.config, self.kv
        while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
            req = self.waiting[0]
            hits = kv.lookup(req.block_hashes, req.total) if not req.holding.blocks else 0
            cached = hits * kv.block_size
            need = req.total - cached
            if not cfg.chunked_prefill and need > budget:
                break
            kv.acquire(req.holding, req.block_hashes[:hits])
            n = self._chunk(need, budget)
            if not kv.grow(req.holding, cached + n):
                kv.release(req.holding)
                break
            self.waiting.popleft()
            kv.count(req.total, hits)
            req.computed = cached
            if req.scheduled_s is None:
                req.scheduled_s = now
                req.cached_tokens = cached
            self.running.append(req)
            items.append((req, n))
            budget -= n

    def _chunk(self, n: int, budget: int) -> int:
        threshold = self.config.long_prefill_token_threshold
        if threshold and n > threshold:
            n = threshold
        return min(n, budget)

    def _preempt(self, req: SimRequest) -> None:
        self.kv.release(req.holding)
        req.computed = 0
        req.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(req)

    def complete(self, batch: Batch, now: float) -> tuple[list[SimRequest], list[SimRequest]]:
        """The step ended at ``now``: (requests that sampled a token, requests finished)."""
        emitted, finished = [], []
        for req, n in batch.items:
            req.computed += n
            if not req.prompt_counted and req.computed >= req.prompt_tokens:
                req.prompt_counted = True
                self.prompt_tokens += req.prompt_tokens
            if len(req.holding.held) < len(req.block_hashes):
                self.kv.register(req.holding, req.block_hashes, req.computed)
            if req.computed >= req.prompt_tokens + req.output:
                req.output += 1
                self.generation_tokens += 1
                if req.first_token_s is None:
                    req.first_token_s = now
                emitted.append(req)
                if req.done:
                    finished.append(req)
        self._finish(finished, now)
        return emitted, finished

    def _finish(self, finished: list[SimRequest], now: float) -> None:
        if not finished:
            return
        gone = set(map(id, finished))
        self.running = [r for r in self.running if id(r) not in gone]
        for req in finished:
            req.finished_s = now
            self.kv.release(req.holding)

    # ---- many decode steps at once (virtual time) -----------------------------------

    def decode_run(self, batch: Batch, max_steps: int) -> int:
        """How many steps like ``batch`` (all decodes, nothing waiting that could join)
        can run back to back, at most ``max_steps``: until the first request finishes, or
        fewer if the KV cache could not hold them. 1 when ``batch`` is not such a step."""
        if max_steps <= 1 or len(batch.items) != len(self.running):
            return 1
        if self.waiting and len(self.running) < self.config.max_num_seqs:
            return 1
        if not batch.decode_only:
            return 1
        return self._kv_steps(
            batch, min(max_steps, *(r.max_tokens - r.output for r, _ in batch.items))
        )

    def _kv_steps(self, batch: Batch, k: int) -> int:
        """``k`` steps of ``batch``, or fewer (halving) if the KV cache cannot hold them."""
        kv = self.kv
        while k > 1:
            extra = sum(
                max(0, kv.blocks_for(r.computed + k) - r.holding.blocks) for r, _ in batch.items
            )
            if extra <= kv.free:
                return k
            k //= 2
        return 1

    def lockstep(self, batch: Batch) -> int:
        """Steps ``batch`` runs as one schedule: ``num_scheduler_steps`` for a batch of
        decodes (vLLM 0.6's multi-step scheduling: the scheduler and the inputs' preparation
        run once for N steps, a prompt's step stays single, PR #7000; a sequence that ends
        within the N steps runs them all, its stop found when the outputs are processed
        after the last), else 1. Fewer, halving, if the KV cache cannot hold them."""
        k = self.config.num_scheduler_steps
        if k <= 1 or not batch.decode_only:
            return 1
        return self._kv_steps(batch, k)

    def run_work(self, batch: Batch, steps: int) -> StepWork:
        """The work of the middle step of ``steps`` decode steps like ``batch``."""
        mid = (steps - 1) / 2
        n = len(batch.items)
        w = batch.work
        return StepWork(
            w.tokens,
            w.attention_pairs + n * mid,
            w.kv_read_tokens + n * mid,
            w.seqs,
            w.decode_kv_tokens + n * mid,
        )

    def complete_run(
        self, batch: Batch, steps: int, now: float
    ) -> tuple[list[SimRequest], list[SimRequest]]:
        """``steps`` decode steps like ``batch`` ended at ``now`` (see :meth:`decode_run`)."""
        if steps == 1:
            return self.complete(batch, now)
        finished = []
        for req, _ in batch.items:
            self.kv.grow(req.holding, req.computed + steps)
            n = min(steps, req.max_tokens - req.output)  # a lockstep run's tokens past the end
            req.computed += n  # are computed and dropped
            req.output += n
            self.generation_tokens += n
            if req.done:
                finished.append(req)
        self._finish(finished, now)
        return [r for r, _ in batch.items], finished
