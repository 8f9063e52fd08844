"""Plan one pool: the fewest replicas meeting every lane's SLOs, its lanes' limits, the check.

1. Replay the pool's grown arrivals without admission limits at N replicas, N searched
   (:class:`obs.plan.search.Search`): the fewest N at which every lane meets its SLOs
   (judged with the calibration margin, :mod:`obs.plan.judge`).
2. At that N, each lane's limits by Little's law from its peak grown arrival rate and its
   mean time in the pool in that replay (:func:`obs.plan.search.little_limits`).
3. Replay again with the limits. A lane that now misses because it refused requests gets
   wider limits (up to ``WIDEN_TRIES`` times); if a lane still misses, one more replica.
4. The check: with the limits, one replica fewer. If every lane still meets its SLOs there
   (the limits protect the others), that is the plan and the step repeats; the first size
   where a lane misses is ``one_fewer``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from obs.config import Config, Lane
from obs.plan.judge import Verdict, judge
from obs.plan.replay import PoolModel, PoolReplay, ReplayRun
from obs.plan.resample import Arrival, arrivals, busiest
from obs.plan.search import Limits, Search, little_limits, widen
from obs.plan.traffic import LaneTraffic, Traffic

WIDEN_TRIES = 4
EXTRA_REPLICAS = 4  # beyond the unlimited search's answer, before giving up on the limits


@dataclass(slots=True)
class Evaluation:
    replicas: int
    limited: bool
    verdicts: dict[str, Verdict]
    virtual_s: float

    @property
    def met(self) -> bool:
        return all(v.met for v in self.verdicts.values())

    @property
    def missing(self) -> list[str]:
        return [name for name, v in self.verdicts.items() if not v.met]


@dataclass(slots=True)
class PoolPlan:
    pool: PoolModel
    lanes: list[str]
    replicas: int | None  # None: no size up to the search's limit met every SLO
    limits: dict[str, Limits] = field(default_factory=dict)
    at_plan: Evaluation | None = None
    one_fewer: Evaluation | None = None  # None when the plan is one replica
    curve: dict[int, Evaluation] = field(default_factory=dict)  # unlimited, by replicas
    requests: int = 0  # grown arrivals replayed
    replayed_s: float = 0.0  # the span they cover
    window_s: float = 0.0
    peak_rate: dict[str, float] = field(default_factory=dict)  # grown, requests/s
    service_s: dict[str, float] = field(default_factory=dict)


Say = Callable[[str], None]
Progress = Callable[[int, int], None]


class PoolPlanner:
    """Plans one pool of ``config`` from ``traffic`` at ``growth``."""

    def __init__(
        self,
        config: Config,
        pool: PoolModel,
        traffic: Traffic,
        growth: float,
        margin: float,
        *,
        seed: int = 0,
        max_requests: int = 200_000,
        most: int = 1024,
        say: Say | None = None,
        progress: Callable[[str], Progress | None] | None = None,
    ) -> None:
        self.config = config
        self.pool = pool
        self.growth = growth
        self.margin = margin
        self.most = most
        self.say = say or (lambda _m: None)
        self.progress = progress
        self.lanes: list[Lane] = [ln for ln in config.lanes if ln.pool == pool.name]
        lts = [traffic.lanes[ln.name] for ln in self.lanes if ln.name in traffic.lanes]
        self.traffic = traffic
        nbins = len(lts[0].counts) if lts else 0
        totals = [sum(lt.counts[i] for lt in lts) * growth for i in range(nbins)]
        first, end = busiest(totals, max_requests) if totals else (0, 0)
        cut = [
            LaneTraffic(lt.lane, lt.pool, lt.counts[first:end], lt.shapes, lt.served) for lt in lts
        ]
        self.arrivals: list[Arrival] = arrivals(cut, traffic.bin_s, growth, seed)
        self.plan = PoolPlan(pool, [ln.name for ln in self.lanes], None)
        # Per unlimited replay (by replicas): each lane's mean time in the pool, seconds.
        self._services: dict[int, dict[str, float]] = {}
        self.plan.requests = len(self.arrivals)
        self.plan.replayed_s = (end - first) * traffic.bin_s
        self.plan.window_s = traffic.span_s
        for lt in cut:
            peak = max(lt.counts, default=0)
            self.plan.peak_rate[lt.lane] = peak * growth / traffic.bin_s

    # ---- one replay ------------------------------------------------------------------

    def evaluate(self, replicas: int, limits: dict[str, Limits] | None) -> Evaluation:
        by_lane: dict[str, Limits | None] = dict(limits or {})
        replay = PoolReplay(self.config, self.pool, self.lanes, replicas, by_lane)
        label = f"{self.pool.name} x{replicas}{' limited' if limits else ''}"
        run = replay.run(self.arrivals, self.progress(label) if self.progress else None)
        ev = Evaluation(replicas, limits is not None, self._judge(run), run.virtual_s)
        met = "every lane met" if ev.met else f"missed: {', '.join(ev.missing)}"
        self.say(
            f"[plan] pool {self.pool.name}: {replicas} replica{'s' * (replicas != 1)}"
            f"{' with the limits' if limits else ', no limits'}: {len(self.arrivals)} requests, "
            f"{met}"
        )
        if limits is None:
            self.plan.curve[replicas] = ev
            self._services[replicas] = {
                name: statistics.fmean(served) if served else 0.0
                for name, outs in run.outcomes.items()
                for served in [[o.service_s for o in outs if o.service_s is not None]]
            }
        return ev

    def _judge(self, run: ReplayRun) -> dict[str, Verdict]:
        return {ln.name: judge(ln, run.outcomes[ln.name], self.margin) for ln in self.lanes}

    # ---- the plan --------------------------------------------------------------------

    def run(self) -> PoolPlan:
        plan = self.plan
        if not self.arrivals:
            plan.replicas = 1  # no recorded traffic: one replica, limits as configured
            return plan
        search = Search(lambda n: self.evaluate(n, None).met, self.most)
        n = search.fewest()
        if n is None:
            self.say(
                f"[plan] pool {self.pool.name}: no size up to {self.most} replicas meets every SLO"
            )
            return plan
        for size in range(n, n + EXTRA_REPLICAS + 1):
            checked = self._limited(size)
            if checked is not None:
                plan.replicas, plan.at_plan = size, checked
                break
        if plan.replicas is None:
            return plan
        while plan.replicas > 1:
            fewer = self.evaluate(plan.replicas - 1, plan.limits)
            if fewer.met:
                plan.replicas, plan.at_plan = plan.replicas - 1, fewer
                continue
            plan.one_fewer = fewer
            break
        if plan.replicas + 1 not in plan.curve:
            self.evaluate(plan.replicas + 1, None)
        return plan

    def _limited(self, replicas: int) -> Evaluation | None:
        """The limits at ``replicas``, widened until no lane misses for refusing; the
        checked replay, or None when a lane still misses."""
        if replicas not in self._services:
            self.evaluate(replicas, None)
        services = self._services[replicas]
        limits = {}
        for ln in self.lanes:
            rate = self.plan.peak_rate.get(ln.name, 0.0)
            if not rate:
                continue  # no recorded traffic: the lane keeps the limits it has
            service = services.get(ln.name, 0.0)
            self.plan.service_s[ln.name] = service
            limits[ln.name] = little_limits(rate, service)
        for _ in range(WIDEN_TRIES + 1):
            self.plan.limits = limits
            ev = self.evaluate(replicas, limits)
            if ev.met:
                return ev
            refusing = [name for name in ev.missing if ev.verdicts[name].rejected]
            if not refusing:
                return None
            limits = {k: widen(v) if k in refusing else v for k, v in limits.items()}
        return None
