"""What a profile's simulated pools can serve of the mix, and admission sized from it.

From the seeded plan (the mix's first ``SAMPLE`` requests) each lane gets its share of
the requests, its mean uncached prompt and its mean answer; from the performance model
(obs.engines.sim.hardware) each request of a lane gets a service time on its pool:
the prefill of its uncached prompt plus its answer's decode steps at the pool's full
batch (``max_num_seqs`` sequences; a slow reader also holds its slot while it reads).

- a pool's **capacity** (requests/s) is what its replicas' GPU time allows: one request
  of its lanes' mix costs ``prefill + answer x step / batch`` GPU seconds;
- a lane's **admission limit** follows Little's law at that capacity: the requests of
  the lane in flight when its pool serves its capacity, ``lambda x W`` (its share of the
  pool's capacity x its service time), times ``HEADROOM`` for bursts;
- one gate per pool (``admission: shared``, the lab's global pool) takes the sum of
  its lanes' limits for all of them.

The profile's own admission blocks (``admission: lanes``) are kept as written. Pure,
apart from walking the plan.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from obs.config import Admission, Config, Lane
from obs.engines.sim.hardware import StepWork
from obs.lanes import CHARS_PER_TOKEN, Classifier, RequestAttrs
from obs.loadgen.mix import Mix
from obs.loadgen.plan import Arrivals, PlannedRequest, iter_plan
from obs.sweep.profile import GpuFlags, Profile

SAMPLE = 20_000  # planned requests the lane shares and lengths are taken from
HEADROOM = 2.0  # admission limit over the lane's in-flight requests at capacity
QUEUE_PER_SLOT = 2  # queued requests per admission slot
ROUTE = "/v1/chat/completions"
MODEL = "llama-3.1-8b"
SSE_BYTES_PER_TOKEN = 250  # one vLLM chat chunk carrying one token (loadgen/default_mix.yaml)


def request_attrs(p: PlannedRequest) -> tuple[RequestAttrs, int]:
    """What the relay computes of a planned request (the classifier's input) and the
    number of chat messages it carries."""
    messages = 1 + 2 * len(p.history)
    estimate = max(1, p.total_prompt_tokens + (8 * messages) // CHARS_PER_TOKEN)
    attrs = RequestAttrs(
        route=ROUTE,
        model=MODEL,
        stream=p.stream,
        headers={"x-client-class": p.client_class},
        tenant=None,
        max_tokens=p.max_tokens,
        prompt_tokens=estimate,
    )
    return attrs, messages


def uncached_tokens(p: PlannedRequest) -> int:
    """The prompt tokens a replica computes when the shared prefix (the RAG document, the
    agent's earlier turns) is in its cache."""
    if p.document is not None or p.client_class == "agent":
        return max(1, p.total_prompt_tokens - p.prefix_tokens - sum(u + a for u, a in p.history))
    return p.total_prompt_tokens


@dataclass(frozen=True, slots=True)
class LaneLoad:
    """One lane's part of the mix: requests per session, mean uncached prompt and answer,
    and the seconds a slow reader keeps reading after its answer is done (0 if none)."""

    per_session: float
    prompt: float
    output: float
    read_s: float


def lane_loads(config: Config, mix: Mix, seed: int = 0) -> dict[str, LaneLoad]:
    """Each lane's share of the mix, from the plan's first :data:`SAMPLE` requests."""
    classifier = Classifier(config)
    plan = itertools.islice(iter_plan(mix, seed, Arrivals(rate=1.0)), SAMPLE)
    sums: dict[str, list[float]] = {}
    sessions = set()
    for p in plan:
        sessions.add(p.session)
        lane = classifier.classify(request_attrs(p)[0]).name
        rate = getattr(mix.spec(p.client_class), "read_bytes_per_s", None)
        read = p.max_tokens * SSE_BYTES_PER_TOKEN / rate if p.stream and rate else 0.0
        s = sums.setdefault(lane, [0.0, 0.0, 0.0, 0.0])
        s[0] += 1
        s[1] += uncached_tokens(p)
        s[2] += p.max_tokens
        s[3] += read
    return {
        lane: LaneLoad(n / len(sessions), prompt / n, out / n, read / n)
        for lane, (n, prompt, out, read) in sums.items()
    }


def decode_step_s(flags: GpuFlags, context: float) -> float:
    """One decode step of a full batch (``max_num_seqs``) at ``context`` tokens each."""
    batch = flags.max_num_seqs or 256
    c = batch * context
    return flags.perf().step_seconds(StepWork(batch, c, c, batch, c))


def prefill_s(flags: GpuFlags, tokens: float) -> float:
    """GPU seconds of a ``tokens`` prefill inside full steps (its share of their cost)."""
    budget = flags.max_num_batched_tokens or 8192
    step = flags.perf().step_seconds(StepWork(budget, budget * budget / 2, budget, 1))
    return tokens * step / budget


def service_s(flags: GpuFlags, load: LaneLoad) -> tuple[float, float]:
    """(GPU seconds one request costs its replica, seconds it is in flight)."""
    step = decode_step_s(flags, load.prompt + load.output / 2)
    batch = flags.max_num_seqs or 256
    prefill = prefill_s(flags, load.prompt)
    return prefill + load.output * step / batch, prefill + load.output * step + load.read_s


@dataclass(frozen=True, slots=True)
class Sizing:
    """A profile's capacity and the admission the stress gives it."""

    sessions_per_s: float  # the most sessions/s its busiest pool allows
    pool_requests_per_s: dict[str, float]
    limits: dict[str, int]  # lane -> max_concurrency (Little's law at capacity)

    def lanes(self, config: Config, mode: str) -> dict[str, Lane]:
        """Each lane with the admission ``mode`` gives it (``lanes``: as written)."""
        out = {}
        for lane in config.lanes:
            if mode == "lanes":
                out[lane.name] = lane
                continue
            a = lane.admission
            if mode == "shared":
                n = sum(self.limits[x.name] for x in config.lanes if x.pool == lane.pool)
                admission = Admission(
                    max_concurrency=n, max_queue=QUEUE_PER_SLOT * n, queue_timeout_s=5.0
                )
            elif a.max_concurrency is None:  # the profile sets no limit: none
                admission = a
            else:
                n = self.limits[lane.name]
                admission = a.model_copy(
                    update={
                        "max_concurrency": n,
                        "max_queue": QUEUE_PER_SLOT * n,
                        "token_budget": None,
                    }
                )
            out[lane.name] = lane.model_copy(update={"admission": admission})
        return out


def size(profile: Profile, mix: Mix, seed: int = 0) -> Sizing:
    """The profile's capacity on the mix and its lanes' Little's-law admission limits."""
    loads = lane_loads(profile.config, mix, seed)
    pools = profile.gpu_pools()
    by_pool: dict[str, list[Lane]] = {}
    for lane in profile.config.lanes:
        by_pool.setdefault(lane.pool, []).append(lane)
    sessions = math.inf
    pool_rps: dict[str, float] = {}
    limits: dict[str, int] = {}
    for pool, lanes in by_pool.items():
        flags = pools[pool]
        mine = {lane.name: loads[lane.name] for lane in lanes if lane.name in loads}
        per_session = sum(x.per_session for x in mine.values())
        if per_session == 0:
            pool_rps[pool] = 0.0
            limits.update({lane.name: 1 for lane in lanes})
            continue
        gpu = sum(x.per_session * service_s(flags, x)[0] for x in mine.values())
        cap_sessions = flags.replicas / gpu  # sessions/s this pool's GPUs serve
        sessions = min(sessions, cap_sessions)
        pool_rps[pool] = cap_sessions * per_session
        for lane in lanes:
            x = mine.get(lane.name)
            in_flight = cap_sessions * x.per_session * service_s(flags, x)[1] if x else 0.0
            limits[lane.name] = max(1, math.ceil(HEADROOM * in_flight))
    return Sizing(sessions, pool_rps, limits)
