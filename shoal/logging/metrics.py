"""Episode statistics over a sliding window, and phase timers."""

from __future__ import annotations

import math
import time
from collections import deque
from contextlib import contextmanager

import numpy as np


class EpisodeWindow:
    """Returns and lengths of the last ``size`` finished episodes (100 by default: the window of
    every algorithm's ``episode_return_mean``, the figure ``Stop.reward`` reads)."""

    def __init__(self, size: int = 100) -> None:
        self.returns: deque[float] = deque(maxlen=size)
        self.lengths: deque[int] = deque(maxlen=size)
        self.total = 0

    def add(self, returns, lengths) -> None:
        self.returns.extend(float(r) for r in returns)
        self.lengths.extend(int(n) for n in lengths)
        self.total += len(returns)

    def metrics(self) -> dict[str, float]:
        if not self.returns:
            nan = math.nan
            return {"episode_return_mean": nan, "episode_return_min": nan, "episode_return_max": nan,
                    "episode_len_mean": nan, "episodes_total": self.total}
        r = np.fromiter(self.returns, dtype=np.float64)
        return {
            "episode_return_mean": float(r.mean()),
            "episode_return_min": float(r.min()),
            "episode_return_max": float(r.max()),
            "episode_len_mean": float(np.mean(self.lengths)),
            "episodes_total": self.total,
        }

    def get_state(self) -> dict:
        return {"returns": list(self.returns), "lengths": list(self.lengths), "total": self.total}

    def set_state(self, state: dict) -> None:
        self.returns.clear()
        self.lengths.clear()
        self.returns.extend(state["returns"])
        self.lengths.extend(state["lengths"])
        self.total = int(state["total"])


class Timers:
    """Wall time per named phase; reports the mean milliseconds since the last ``report()``."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    @contextmanager
    def time(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.sums[name] = self.sums.get(name, 0.0) + time.perf_counter() - t0
            self.counts[name] = self.counts.get(name, 0) + 1

    def report(self) -> dict[str, float]:
        out = {f"timers/{k}_ms": 1000.0 * v / self.counts[k] for k, v in self.sums.items()}
        self.sums.clear()
        self.counts.clear()
        return out
