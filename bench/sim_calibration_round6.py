"""Round 6's points: every point of rounds 1-5 is a fit point (all had been seen), and round
6's held-out points, registered before the frozen model ran on any of them.

Round 5's inference-bench runs join the fit replayed as the source ran them (round 6's
harness change, bench/sim_calibration_replay.py): its own prompt list (the long regime's
10 distinct prompts sent 10 times each, the short regime's 49) after its warm-up of
``2 x C`` requests, so the real server's prefix-cache hits are the simulated cache's too;
the L4 long runs are then inside the model's domain.
"""

from __future__ import annotations

from dataclasses import replace

from bench.sim_calibration_cases import FIT, ROUND3, Case
from bench.sim_calibration_replay import IB_LONG, IB_SHORT, IB_WARMUP_ROUNDS
from bench.sim_calibration_round5 import ROUND4, ROUND5_HELD_OUT


def _seen(case: Case) -> Case:
    """A round-5 point as a fit point; inference-bench's with the source's prompts."""
    if not case.name.startswith("ib-"):
        return replace(case, held_out=False)
    prompts = IB_LONG if "-long-" in case.name else IB_SHORT
    return replace(
        case,
        held_out=False,
        prompt_set=prompts,
        warmup_rounds=IB_WARMUP_ROUNDS,
        outside_domain="",
    )


ROUND5 = tuple(_seen(c) for c in ROUND5_HELD_OUT)  # seen in round 5

ROUND6_HELD_OUT: tuple[Case, ...] = ()

CASES: tuple[Case, ...] = FIT + ROUND3 + ROUND4 + ROUND5 + ROUND6_HELD_OUT
