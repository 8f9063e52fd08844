"""Round 5's points: every point of rounds 1-4 is a fit point (all had been seen).

Round 5's held-out points (``ROUND5_HELD_OUT``) are registered here, in a commit of their
own, after the model was frozen and before it runs on any of them (docs/sim.md, "Round 5").
"""

from __future__ import annotations

from dataclasses import replace

from bench.sim_calibration_cases import FIT, ROUND3, Case
from bench.sim_calibration_round4 import ROUND4_HELD_OUT

ROUND4 = tuple(replace(c, held_out=False) for c in ROUND4_HELD_OUT)  # seen in round 4

ROUND5_HELD_OUT: tuple[Case, ...] = ()

CASES: tuple[Case, ...] = FIT + ROUND3 + ROUND4 + ROUND5_HELD_OUT
