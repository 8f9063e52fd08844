"""promtool groups for the burn-rate alerts' evidence floor (``SLI.min_requests``).

Per SLO of a lane, on the rules generated from its config:

* **two requests in seven hours, one of them bad** (the second, 30 minutes before the end):
  every window reads a burn far above its factor, and no alert fires, page or ticket;
* **600 requests a minute, 90% bad, for an hour**: the page windows fire;
* **a trickle, every request bad**, slower than any page window's floor can be met: no page
  ever, and each ticket window whose floor the trickle meets fires (a low-traffic lane gets
  a ticket instead of silence).
"""

from __future__ import annotations

import math
from typing import Any

from obs import conventions as c
from obs.durations import seconds
from obs.slo import LATENCY_HISTOGRAMS

from . import series as s
from . import timeline as tl
from .model import SLI, AlertModel, Window
from .rules import RuleIndex

Group = dict[str, Any]
HOUR_S = 3600
BUSY_PER_MIN, BUSY_BAD = 600, 540  # 90% bad


def evidence_tests(sli: SLI, index: RuleIndex) -> list[Group]:
    """The three cases for one SLO."""
    return [_two_requests(sli), _busy(sli, index), *_trickle(sli, index)]


def lane_evidence_tests(model: AlertModel, lane: str, index: RuleIndex) -> list[Group]:
    """The evidence floor's cases for every SLO of ``lane``."""
    return [g for sli in model.lane_slis(lane) for g in evidence_tests(sli, index)]


def stairs(times: list[int], steps: int) -> str:
    """A counter that steps up by one at each minute in ``times``, over ``steps`` samples."""
    out, value, start = [], 0, 0
    for t in [*sorted(times), steps]:
        if t > start:
            out.append(f"{value}x{t - start - 1}")
        value, start = value + 1, max(t, start)
    return " ".join(out)


def _inputs(sli: SLI, good: list[int], bad: list[int], steps: int) -> list[s.Series]:
    """The SLI's series with a request at each minute of ``good`` and of ``bad``."""
    labels = {c.LANE: sli.lane, c.POOL: sli.pool}
    every = sorted(good + bad)
    if sli.kind == "availability":

        def by(outcome: str, finish: str, times: list[int]) -> s.Series:
            extra = {c.MODEL: s.MODEL, c.OUTCOME: outcome, c.FINISH_REASON: finish}
            return s.series(c.REQUESTS.series[0], {**labels, **extra}, stairs(times, steps))

        return [by(c.OK, "stop", good), by(c.ERROR, "none", bad)]
    bucket, _, count = LATENCY_HISTOGRAMS[sli.kind].series
    return [
        s.series(bucket, {**labels, "le": sli.le}, stairs(good, steps)),
        s.series(bucket, {**labels, "le": "+Inf"}, stairs(every, steps)),
        s.series(count, labels, stairs(every, steps)),
    ]


def _two_requests(sli: SLI) -> Group:
    end = 7 * 60  # minutes
    inputs = _inputs(sli, [60], [end - 30], end + 1)
    checks = [tl.alert_test(sli.alert, (end - m) * tl.STEP_S, []) for m in (25, 15, 0)]
    return tl.group(
        f"{sli.lane} {sli.kind}: 2 requests in 7 hours, one bad: no page, no ticket",
        inputs,
        checks,
    )


def _expected(sli: SLI, index: RuleIndex, windows: list[Window], burn: float) -> list[Any]:
    return [
        s.expected(
            index.find(
                sli.alert, lane=sli.lane, slo=sli.kind, long_window=w.long, short_window=w.short
            ),
            {},
            burn,
        )
        for w in windows
    ]


def _busy(sli: SLI, index: RuleIndex) -> Group:
    end = 60 * tl.STEP_S
    steps = end // tl.STEP_S + 1
    inputs = s.sli_inputs(sli, BUSY_PER_MIN, BUSY_BAD, steps)
    burn = BUSY_BAD / BUSY_PER_MIN / sli.budget
    # The condition holds from the second sample (rate() needs two).
    firing = [w for w in sli.windows if burn > w.factor and tl.fires_by(end, tl.STEP_S, w.for_)]
    pages = [w for w in firing if w.severity == "page"]
    return tl.group(
        f"{sli.lane} {sli.kind}: {BUSY_PER_MIN} requests a minute, 90% bad, for an hour: "
        f"{len(pages)} page window(s) fire",
        inputs,
        [tl.alert_test(sli.alert, end, _expected(sli, index, firing, burn))],
    )


def _trickle(sli: SLI, index: RuleIndex) -> list[Group]:
    pages = [w for w in sli.windows if w.severity == "page"]
    if not pages:
        return []
    longest = max(seconds(w.long) for w in pages) / HOUR_S
    per_hour = sli.min_requests / longest / 2  # half of what any page window needs
    held: list[tuple[Window, float]] = []  # each window that the trickle fires, and when
    for w in sli.windows:
        long_h, short_h = seconds(w.long) / HOUR_S, seconds(w.short) / HOUR_S
        in_long, in_short = per_hour * long_h, per_hour * short_h
        if in_long < sli.min_requests * 1.2 or in_short < sli.floor(w, w.short) * 1.2:
            continue  # (pages never get here: half their floor at most)
        met_h = max(sli.min_requests / per_hour, short_h) + 0.5
        held.append((w, met_h + seconds(w.for_) / HOUR_S))
    end_h = max((t for _, t in held), default=longest) + 1
    end = math.ceil(end_h * 60)
    gap = 60 / per_hour
    bad = [round(gap * (k + 1)) for k in range(int(end / gap)) if round(gap * (k + 1)) < end]
    firing = [w for w, _ in held]
    return [
        tl.group(
            f"{sli.lane} {sli.kind}: {per_hour:.3g} requests an hour, all bad, for "
            f"{end_h:.3g} hours: no page, {len(firing)} ticket window(s) fire",
            _inputs(sli, [], bad, end + 1) + s.misses(sli, end + 1),
            [
                tl.alert_test(
                    sli.alert, end * tl.STEP_S, _expected(sli, index, firing, 1 / sli.budget)
                )
            ],
        )
    ]
