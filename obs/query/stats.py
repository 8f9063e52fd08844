"""Significance tests for ``compare``: Mann-Whitney U and two proportions (pure Python).

Both use the normal approximation, which is accurate for the sample sizes
request logs have (more than ~20 per side); below that ``compare`` still
reports the p-value but it is approximate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def normal_sf2(z: float) -> float:
    """Two-sided p-value of a standard normal statistic."""
    return math.erfc(abs(z) / math.sqrt(2.0))


@dataclass(frozen=True, slots=True)
class MannWhitney:
    u: float  # U statistic of the first sample
    z: float
    p_value: float
    # P(after > before) + 0.5 P(equal): 0.5 = no shift, > 0.5 = after tends to be larger.
    prob_after_greater: float


def mann_whitney(n1: int, n2: int, rank_sum_1: float, tie_term: float) -> MannWhitney | None:
    """Two-sided Mann-Whitney U test from the first sample's rank sum.

    ``rank_sum_1`` sums the mid-ranks of sample 1 within both samples pooled;
    ``tie_term`` is the sum over tie groups of ``t**3 - t``. Uses the tie
    correction and a 0.5 continuity correction. None when a side is empty.
    """
    if n1 == 0 or n2 == 0:
        return None
    n = n1 + n2
    u1 = rank_sum_1 - n1 * (n1 + 1) / 2.0
    mean = n1 * n2 / 2.0
    var = n1 * n2 / 12.0 * ((n + 1) - tie_term / (n * (n - 1)))
    if var <= 0:
        return MannWhitney(u1, 0.0, 1.0, 0.5)
    diff = u1 - mean
    z = math.copysign(max(0.0, abs(diff) - 0.5), diff) / math.sqrt(var)
    # U1 counts pairs where sample 1 (before) is larger; the effect is stated for "after".
    return MannWhitney(u1, z, normal_sf2(z), 1.0 - u1 / (n1 * n2))


def two_proportions(x1: int, n1: int, x2: int, n2: int) -> float | None:
    """Two-sided p-value of the pooled two-proportion z-test (None when undefined)."""
    if n1 == 0 or n2 == 0:
        return None
    pooled = (x1 + x2) / (n1 + n2)
    var = pooled * (1 - pooled) * (1 / n1 + 1 / n2)
    if var <= 0:
        return 1.0
    z = (x2 / n2 - x1 / n1) / math.sqrt(var)
    return normal_sf2(z)
