"""The stress replay's admission sized from capacity, and a pool's prefix_caching and
stream_interval honoured by the replay (obs.sweep.capacity, obs.sweep.replay)."""

from __future__ import annotations

import gzip
from dataclasses import replace
from pathlib import Path

import orjson

from obs.loadgen.mix import load_mix
from obs.sweep.capacity import HEADROOM, size
from obs.sweep.profile import SHIPPED, parse_profile, resolve
from obs.sweep.replay import Replay, chunk_gaps

MIX = load_mix()


def _events(path: Path) -> list[dict]:
    with gzip.open(path) as f:
        return [orjson.loads(line) for line in f]


def test_limits_follow_littles_law_at_the_pools_capacity() -> None:
    """Each lane's limit is HEADROOM x its in-flight requests at its pool's capacity: a
    lane whose requests stay longer (slow readers) gets more slots than one of short
    answers, and a profile with more GPUs for the same lanes serves more sessions/s."""
    balanced = size(resolve("single-balanced"), MIX)
    assert balanced.sessions_per_s > 0
    assert all(n >= 1 for n in balanced.limits.values())
    assert balanced.limits["slow-stream"] > balanced.limits["long-prefill"]
    assert HEADROOM >= 1
    spec = resolve("single-balanced")
    flags = spec.engines["main"]
    assert flags.gpu is not None
    bigger = replace(
        spec,
        engines={
            "main": flags.model_copy(update={"gpu": flags.gpu.model_copy(update={"replicas": 8})})
        },
    )
    assert size(bigger, MIX).sessions_per_s > 1.9 * balanced.sessions_per_s


def test_the_single_pool_baseline_has_one_gate_for_all_traffic(tmp_path: Path) -> None:
    """``admission: shared`` (the shipped single-pool profiles) gives every lane of the pool
    the same gate, sized as the sum of the lanes' limits; ``capacity`` gives each lane its
    own; a lane with no limit in the profile keeps none."""
    base = Replay(resolve(SHIPPED[0]), MIX, tmp_path / "a.jsonl.gz")
    assert resolve(SHIPPED[0]).admission == "shared"
    assert len({id(g) for g in base.gates.values()}) == 1
    (n,) = {a.max_concurrency for a in base.admission.values()}
    assert n == sum(base.sizing.limits.values())
    aware = Replay(resolve("class-aware"), MIX, tmp_path / "b.jsonl.gz")
    assert len({id(g) for g in aware.gates.values()}) == len(aware.gates)
    assert {k: a.max_concurrency for k, a in aware.admission.items()} == aware.sizing.limits
    data = {
        "name": "open",
        "admission": "capacity",
        "pools": [{"name": "main", "engine": {"gpu": {"replicas": 1}}}],
        "lanes": [{"name": "chat", "pool": "main"}],
        "default_lane": "chat",
    }
    free = Replay(parse_profile(data), MIX, tmp_path / "c.jsonl.gz")
    assert free.admission["chat"].max_concurrency is None
    for replay in (base, aware, free):  # never run: close their loops
        replay.loop.close()


def _profile(prefix_caching: bool, interval: int) -> dict:
    """The pool's flags at its own level (prefix caching) and in its gpu: block (interval)."""
    gpu = {"replicas": 1, "stream_interval": interval}
    engine = {"prefix_caching": prefix_caching, "gpu": gpu}
    return {
        "name": f"p{int(prefix_caching)}{interval}",
        "pools": [{"name": "main", "engine": engine}],
        "base_lanes": "default",
        "lanes": {lane: {"pool": "main"} for lane in SHIPPED_LANES},
    }


SHIPPED_LANES = ("slow-stream", "agent", "rag", "batch", "long-prefill", "chat")


def test_the_replay_honours_prefix_caching_and_stream_interval(tmp_path: Path) -> None:
    """With prefix caching off no request finds cached tokens (on: RAG and agent turns do);
    with stream_interval 4 a streamed answer comes in 1 + ceil((n-1)/4) chunks and its
    inter-token gaps are per chunk (about four tokens' worth)."""
    runs = {}
    for caching, interval in ((True, 1), (False, 1), (True, 4)):
        out = tmp_path / f"{caching}-{interval}.jsonl.gz"
        Replay(parse_profile(_profile(caching, interval)), MIX, out).run(600, 4.0, 0)
        runs[caching, interval] = {e["request_id"]: e for e in _events(out)}
    assert any((e["cached_tokens"] or 0) > 0 for e in runs[True, 1].values())
    assert all(not e["cached_tokens"] for e in runs[False, 1].values())
    one, four = runs[True, 1], runs[True, 4]
    streamed = [
        k
        for k, e in one.items()
        if e["status"] == "ok" and e["stream"] and e["completion_tokens"] > 9
    ]
    assert streamed
    for k in streamed:
        n = four[k]["completion_tokens"]
        assert four[k]["output_chunks"] == 1 + -(-(n - 1) // 4)
        assert one[k]["output_chunks"] == n
    k = streamed[0]
    assert four[k]["itl_p50_ms"] > 3 * one[k]["itl_p50_ms"]


def test_chunk_gaps_sum_each_chunks_tokens() -> None:
    """Gaps kept as runs become one gap per chunk of n tokens (the last chunk partial)."""
    assert chunk_gaps([(1.0, 10)], 4) == [(4.0, 2), (2.0, 1)]
    assert chunk_gaps([(1.0, 3), (2.0, 3)], 2) == [(2.0, 1), (3.0, 1), (4.0, 1)]
    assert chunk_gaps([(1.0, 5)], 1) == [(1.0, 5)]
    assert sum(g * k for g, k in chunk_gaps([(0.5, 7), (1.5, 9)], 3)) == 0.5 * 7 + 1.5 * 9
