"""The simulated engine's pure core: the step scheduler, the block cache, the step-time model."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from obs.engines.sim.hardware import StepWork, perf_model
from obs.engines.sim.kvcache import KvCache
from obs.engines.sim.scheduler import Scheduler, SchedulerConfig, SimRequest, vllm_defaults
from obs.errors import ConfigError

H100 = perf_model("H100", "llama-3.1-8b")


def _drain(s: Scheduler, limit: int = 100_000) -> list[int]:
    """Run steps until idle; the token count of every step."""
    sizes: list[int] = []
    t = 0.0
    while s.busy and len(sizes) < limit:
        batch = s.schedule(t)
        sizes.append(batch.work.tokens)
        t += 0.01
        s.complete(batch, t)
    return sizes


def test_budget_and_batch_size_are_never_exceeded() -> None:
    """No step schedules more tokens than --max-num-batched-tokens or more sequences than
    --max-num-seqs, and every request gets all its output."""
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=4), KvCache(10_000, 16))
    reqs = [SimRequest(f"r{i}", 300 + i, 20) for i in range(10)]
    for r in reqs:
        s.add(r)
    t = 0.0
    while s.busy:
        batch = s.schedule(t)
        assert batch.work.tokens <= 256 and len(s.running) <= 4
        t += 0.01
        s.complete(batch, t)
    assert all(r.output == 20 and r.finished_s is not None for r in reqs)


def test_long_prefill_threshold_caps_one_request_per_step() -> None:
    """A long prompt is prefilled in chunks of at most --long-prefill-token-threshold."""
    s = Scheduler(SchedulerConfig(long_prefill_token_threshold=512), KvCache(10_000, 16))
    s.add(SimRequest("long", 4000, 2))
    assert max(_drain(s)) == 512


def test_without_chunked_prefill_a_prompt_over_the_budget_waits_whole() -> None:
    """With chunked prefill off, a waiting prompt that does not fit the budget left does not
    start this step: the running decode runs alone."""
    s = Scheduler(
        SchedulerConfig(max_num_batched_tokens=1000, chunked_prefill=False), KvCache(10_000, 16)
    )
    s.add(SimRequest("a", 600, 50))
    s.complete(s.schedule(), 0.01)
    s.add(SimRequest("b", 600, 5))
    batch = s.schedule()
    assert [r.rid for r, _ in batch.items] == ["a", "b"]  # 1 + 600 fits in 1000
    s2 = Scheduler(
        SchedulerConfig(max_num_batched_tokens=500, chunked_prefill=False), KvCache(10_000, 16)
    )
    s2.add(SimRequest("a", 400, 50))
    s2.complete(s2.schedule(), 0.01)
    s2.add(SimRequest("b", 600, 5))
    assert [r.rid for r, _ in s2.schedule().items] == ["a"]


def test_a_shared_prefix_is_reused_block_by_block() -> None:
    """The second request with the same leading blocks finds them cached and computes only
    the rest; the counters say so in tokens."""
    kv = KvCache(1000, 16)
    s = Scheduler(SchedulerConfig(), kv)
    hashes = [hash(("doc", i)) for i in range(10)]
    s.add(SimRequest("a", 170, 2, hashes))
    _drain(s)
    b = SimRequest("b", 170, 2, hashes)
    s.add(b)
    first = s.schedule()
    assert first.items == [(b, 170 - 160)]
    assert b.cached_tokens == 160 and kv.hit_tokens == 160 and kv.query_tokens == 340


def test_a_full_cache_preempts_the_newest_request_and_it_still_finishes() -> None:
    """When the KV cache has no block left, the newest running request is preempted (counted),
    recomputed later, and every request still gets all its output."""
    s = Scheduler(SchedulerConfig(), KvCache(40, 16))
    reqs = [SimRequest(f"r{i}", 100, 120) for i in range(3)]
    for r in reqs:
        s.add(r)
    _drain(s)
    assert s.preemptions > 0
    assert all(r.output == 120 for r in reqs)
    assert s.kv.free == s.kv.num_blocks


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 600), st.integers(1, 40), st.integers(0, 3)),
        min_size=1,
        max_size=12,
    ),
    st.integers(20, 200),
    st.integers(16, 1024),
    st.integers(1, 8),
)
def test_every_request_finishes_and_every_block_comes_back(
    shapes: list[tuple[int, int, int]], blocks: int, budget: int, seqs: int
) -> None:
    """Whatever the prompts, prefixes, cache size and flags, requests that fit the cache all
    finish with their full output, and afterwards every block is free again."""
    kv = KvCache(blocks, 16)
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=max(budget, seqs), max_num_seqs=seqs), kv)
    reqs = []
    for i, (prompt, out, doc) in enumerate(shapes):
        if kv.blocks_for(prompt + out) > blocks:
            continue
        hashes = [hash((doc, j)) for j in range(prompt // 16)]
        reqs.append(SimRequest(f"r{i}", prompt, out, hashes))
        s.add(reqs[-1])
    _drain(s)
    assert not s.busy
    assert all(r.output == r.max_tokens for r in reqs)
    assert kv.free == kv.num_blocks and kv.usage == 0.0


def test_decode_runs_advance_like_single_steps() -> None:
    """Many decode steps taken at once leave the requests where single steps would."""
    a, b = (
        Scheduler(SchedulerConfig(), KvCache(1000, 16)),
        Scheduler(SchedulerConfig(), KvCache(1000, 16)),
    )
    for s in (a, b):
        s.add(SimRequest("x", 50, 40))
        s.add(SimRequest("y", 70, 30))
        s.complete(s.schedule(), 0.0)
    batch = a.schedule()
    steps = a.decode_run(batch, 1000)
    assert steps == 29  # until y (one token out of 30 already) finishes
    a.complete_run(batch, steps, 1.0)
    for _ in range(steps):
        b.complete(b.schedule(), 1.0)
    assert [(r.output, r.computed) for r in a.running] == [
        (r.output, r.computed) for r in b.running
    ]
    assert a.kv.free == b.kv.free


def test_step_time_is_memory_bound_for_decode_and_compute_bound_for_prefill() -> None:
    """A batch of 8 decodes costs about one read of the weights plus the CPU's share; a
    4096-token prefill costs its FLOPs; a mixed step pays its decodes' KV reads on top of
    the prefill; the CPU's share grows with the batch."""
    cal = H100.cal
    decode = H100.step_seconds(StepWork(8, 8 * 1000, 8 * 1000, 8, 8 * 1000))
    weights = H100.weight_bytes / (H100.gpu.bandwidth * cal.mbu)
    cpu8 = cal.step_s + 8 * cal.seq_s + 8 * cal.token_s
    assert weights + cpu8 < decode < 1.2 * weights + cpu8
    prefill = H100.step_seconds(StepWork(4096, 4096 * 2048, 4096, 1))
    flops = 2 * H100.model.params * 4096 / (H100.gpu.flops * cal.mfu)
    assert prefill > flops > weights
    mixed = H100.step_seconds(
        StepWork(4096 + 64, 4096 * 2048 + 64 * 8000, 4096 + 64 * 8000, 65, 64 * 8000)
    )
    assert mixed > prefill + 64 * 8000 * H100.kv_bytes_per_token / (H100.gpu.bandwidth * cal.mbu)
    bigger = H100.step_seconds(StepWork(64, 64 * 1000, 64 * 1000, 64, 64 * 1000))
    assert bigger - decode > 56 * cal.seq_s
    v0 = replace(H100, cal=cal.engine("v0"))  # vLLM V0's CPU share grows with the batch
    v0_decode = v0.step_seconds(StepWork(8, 8 * 1000, 8 * 1000, 8, 8 * 1000))
    v0_bigger = v0.step_seconds(StepWork(64, 64 * 1000, 64 * 1000, 64, 64 * 1000))
    assert v0_bigger - v0_decode > 56 * v0.cal.seq_s > 0
    assert H100.kv_blocks(16) > 10_000


def test_tensor_parallelism_and_fp8_let_a_70b_model_fit_and_cost_all_reduces() -> None:
    """Llama-3.1-70B in BF16 fits no single H100 (GiB memory) but fits four, each holding a
    quarter of the weights and KV; FP8 weights halve the weight bytes; a TP step pays two
    all-reduces per layer, so 4 GPUs decode faster than 1/4 of one GPU's time would not."""
    with pytest.raises(ConfigError, match="does not fit"):
        perf_model("H100", "llama-3.1-70b").kv_blocks(16)
    tp4 = perf_model("H100", "llama-3.1-70b", tp=4)
    fp8 = perf_model("H100", "llama-3.1-70b", tp=4, weights="fp8")
    assert tp4.kv_blocks(16) > 20_000 and fp8.kv_blocks(16) > tp4.kv_blocks(16)
    assert fp8.weight_bytes == tp4.weight_bytes / 2
    work = StepWork(8, 8 * 1000, 8 * 1000, 8, 8 * 1000)
    assert tp4.comm_seconds(8) >= 2 * 80 * tp4.cal.allreduce_s
    assert fp8.step_seconds(work) < tp4.step_seconds(work)
    assert tp4.step_seconds(work) > tp4.weight_bytes / 4 / (tp4.gpu.bandwidth * tp4.cal.mbu)
    assert H100.gpu.memory_bytes == 81559 * 2**20
    with pytest.raises(ConfigError, match="tensor-parallel-size"):
        perf_model("H100", "llama-3.1-70b", tp=3)


def test_a_one_token_prefill_after_a_cache_hit_is_not_taken_for_a_decode() -> None:
    """A prompt whose cached prefix leaves one token to compute gets its first token in a
    single step, not folded into a run of decode steps."""
    kv = KvCache(1000, 16)
    s = Scheduler(SchedulerConfig(), kv)
    hashes = [hash(("p", i)) for i in range(10)]
    s.add(SimRequest("warm", 161, 1, hashes))
    _drain(s)
    s.add(SimRequest("long", 50, 100))
    s.complete(s.schedule(), 0.0)
    late = SimRequest("late", 161, 20, hashes)
    s.add(late)
    batch = s.schedule()
    assert (late, 1) in batch.items and not batch.decode_only
    assert s.decode_run(batch, 1000) == 1
    s.complete_run(batch, 1, 1.0)
    assert late.first_token_s == 1.0 and late.output == 1


def test_vllm_defaults_follow_the_gpu_the_engine_and_the_entry_point() -> None:
    """Without the flags, V1 gives an H100 8192 tokens and 1024 sequences for the API server
    (16384 offline), an A100 80 GB (named out) and an L4 2048 and 256; V0 turns chunked
    prefill off up to a 32k context, its budget the larger of the context and 2048."""
    h100, a100, l4 = (perf_model(g, "llama-3.1-8b").gpu for g in ("H100", "A100", "L4"))
    assert vllm_defaults("H100", h100.memory_bytes) == SchedulerConfig(8192, 1024)
    assert vllm_defaults("H100", h100.memory_bytes, server=False) == SchedulerConfig(16384, 1024)
    assert vllm_defaults("A100", a100.memory_bytes) == SchedulerConfig(2048, 256)
    assert vllm_defaults("L4", l4.memory_bytes, server=False) == SchedulerConfig(8192, 256)
    v0 = vllm_defaults("H100", h100.memory_bytes, v1=False, max_model_len=8000)
    assert v0 == SchedulerConfig(8000, 256, chunked_prefill=False, mixed_steps=False)
    assert (
        vllm_defaults(
            "H100", h100.memory_bytes, v1=False, max_model_len=1000
        ).max_num_batched_tokens
        == 2048
    )
    long = vllm_defaults("H100", h100.memory_bytes, v1=False, max_model_len=131072)
    assert long.chunked_prefill and long.max_num_batched_tokens == 512


def test_the_calibration_has_v0_cpu_costs_for_replaying_v0_runs() -> None:
    """``engine("v0")`` swaps in vLLM V0's CPU costs and keeps the GPU's efficiencies;
    ``engine("v1")`` is the simulator's own; another name is refused."""
    cal = H100.cal
    v0 = cal.engine("v0")
    assert (v0.step_s, v0.seq_s, v0.token_s) == (cal.v0_step_s, cal.v0_seq_s, cal.v0_token_s)
    assert (v0.mfu, v0.mbu) == (cal.mfu, cal.mbu) and cal.engine("v1") is cal
    with pytest.raises(ConfigError, match="engine 'v2'"):
        cal.engine("v2")


def test_v0_steps_prefill_or_decode_never_both() -> None:
    """With mixed steps off (vLLM V0), a prompt that arrives while others decode gets a step
    of its own, the decodes paused for it, and decoding resumes the step after."""
    s = Scheduler(
        SchedulerConfig(2048, 256, chunked_prefill=False, mixed_steps=False), KvCache(10_000, 16)
    )
    s.add(SimRequest("a", 100, 50))
    s.complete(s.schedule(), 0.01)
    s.add(SimRequest("b", 300, 5))
    step = s.schedule(0.01)
    assert [(r.rid, n) for r, n in step.items] == [("b", 300)]
    s.complete(step, 0.02)
    assert sorted(r.rid for r, _ in s.schedule(0.02).items) == ["a", "b"]


def test_fp8_weights_are_read_at_their_own_bandwidth_share_and_the_layer_floor_adds_per_layer() -> (
    None
):
    """A one-sequence decode with FP8 weights reads half the bytes at ``fp8_mbu`` of the
    bandwidth (not ``mbu``); ``layer_s`` adds the same time per layer to every step."""
    bf16 = perf_model("H100", "llama-3.1-8b")
    fp8 = perf_model("H100", "llama-3.1-8b", weights="fp8")
    work = StepWork(1, 100, 100, 1, 100)
    cal = fp8.cal
    assert cal.fp8_mbu < cal.mbu
    read = fp8.weight_bytes / (fp8.gpu.bandwidth * cal.fp8_mbu)
    assert read < fp8.step_seconds(work) - cal.step_s < 1.05 * read + cal.seq_s + cal.token_s
    fast = replace(fp8, cal=replace(cal, fp8_mbu=cal.mbu))
    assert fast.step_seconds(work) < fp8.step_seconds(work) < bf16.step_seconds(work)
    floored = replace(bf16, cal=replace(bf16.cal, layer_s=10e-6))
    assert floored.step_seconds(work) - bf16.step_seconds(work) == pytest.approx(32 * 10e-6)


def test_multi_step_scheduling_runs_every_sequence_n_steps_and_pays_the_cpu_once() -> None:
    """With --num-scheduler-steps 4 (vLLM 0.6, V0) a prompt's step stays single, a decode
    batch runs 4 steps from one schedule, a sequence with 2 tokens left runs them all and
    finishes at the run's end with its own count; the run costs 4 GPU steps, one CPU share
    and the model runner's launch for each step after the first."""
    s = Scheduler(
        SchedulerConfig(2048, 256, chunked_prefill=False, mixed_steps=False, num_scheduler_steps=4),
        KvCache(10_000, 16),
    )
    a, b = SimRequest("a", 100, 10), SimRequest("b", 50, 3)
    s.add(a)
    s.add(b)
    prefill = s.schedule()
    assert s.lockstep(prefill) == 1
    s.complete(prefill, 0.01)
    batch = s.schedule()
    steps = s.lockstep(batch)
    assert steps == 4
    _, finished = s.complete_run(batch, steps, 0.05)
    assert finished == [b] and (a.output, b.output) == (5, 3) and b.finished_s == 0.05
    assert s.generation_tokens == 2 + 4 + 2
    work = s.run_work(batch, steps)
    cpu, one = H100.cpu_seconds(work), H100.step_seconds(work)
    launch = H100.cal.multistep_s
    assert launch > 0
    assert H100.lockstep_seconds(work, 4) == pytest.approx(cpu + 4 * (one - cpu) + 3 * launch)
    assert vllm_defaults("H100", 80 << 30, v1=False, scheduler_steps=4).num_scheduler_steps == 4


def test_tensor_parallel_steps_pay_the_workers_hand_over_per_doubling() -> None:
    """With tp_step_s set, a TP step pays it once per doubling of the workers (log2 tp) on
    top of its all-reduces; one GPU pays none."""
    cal = replace(H100.cal, tp_step_s=1e-3)
    work = StepWork(tokens=8, attention_pairs=8 * 100, kv_read_tokens=8 * 100, seqs=8)
    for tp in (2, 4, 8):
        base = perf_model("H100", "llama-3.1-70b", tp=tp, weights="fp8")
        with_hand_over = replace(base, cal=replace(base.cal, tp_step_s=cal.tp_step_s))
        extra = with_hand_over.step_seconds(work) - base.step_seconds(work)
        assert extra == pytest.approx(1e-3 * {2: 1, 4: 2, 8: 3}[tp])
    assert replace(H100, cal=cal).comm_seconds(8) == 0.0
