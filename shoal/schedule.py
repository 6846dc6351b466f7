"""Piecewise-linear schedules over env steps: learning rates, epsilon, the replay beta.

One class for all of them, so "anneal X over N steps" means the same thing everywhere.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


class PiecewiseSchedule:
    """Piecewise-linear in env steps: ``[(0, 1e-3), (100_000, 0.0)]``; flat outside the points."""

    def __init__(self, points: Sequence[tuple[float, float]]) -> None:
        self.x = np.array([p[0] for p in points], dtype=np.float64)
        self.y = np.array([p[1] for p in points], dtype=np.float64)

    def __call__(self, t: float) -> float:
        return float(np.interp(t, self.x, self.y))


def linear_schedule(start: float, end: float, steps: float) -> PiecewiseSchedule:
    """From ``start`` at step 0 to ``end`` at ``steps``, flat after."""
    return PiecewiseSchedule([(0, start), (steps, end)])
