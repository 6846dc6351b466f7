"""Episode statistics over a sliding window, and phase timers."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from contextlib import contextmanager

import numpy as np


class EpisodeWindow:
    """Returns and lengths of the last ``size`` finished episodes (an algorithm's
    ``episode_window``, 100 by default: the window of its ``episode_return_mean``, the figure
    ``Stop.reward`` reads)."""

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
            return {
                "episode_return_mean": nan,
                "episode_return_min": nan,
                "episode_return_max": nan,
                "episode_len_mean": nan,
                "episodes_total": self.total,
            }
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


class Phase:
    """Timer names: each phase of a training step (or of a learner thread) reports ``timers/<name>_ms``."""

    # driver-side phases of training_step()
    SAMPLE = "sample"  # ask rollout actors for experience, collect what is ready
    STORE = "store"  # add sampled batches to a replay
    REPLAY = "replay"  # ask replay for train batches (Ape-X: owed replay requests)
    ENQUEUE = "enqueue"  # cut train batches and hand them to a learner thread
    LEARN = "learn"  # SGD in the driver, or requests to learner actors
    DRAIN = "drain"  # collect what a learner thread finished
    UPDATE_PRIORITIES = "update_priorities"  # new priorities back to the replay shards
    SYNC = "sync"  # weights (and global vars) to the rollout actors
    SYNC_WEIGHTS = "sync_weights"  # Ape-X: weights to the actors that sampled enough since their last refresh
    SAMPLE_AND_TRAIN = "sample_and_train"  # DD-PPO: one round on every replica
    AGGREGATE = "aggregate"  # DD-PPO: combine the replicas' results
    REGROUP = "regroup"  # DD-PPO: re-form the process group after a failure
    LEAGUE = "league"  # AlphaStar: the league builder's changes after an iteration
    # learner-thread phases
    LEARNER_QUEUE_WAIT = "learner_queue_wait"  # waiting for a train batch
    LEARNER_LOAD = "learner_load"  # moving a batch onto the learner's device(s)
    LEARNER_LOAD_WAIT = "learner_load_wait"  # multi-device: waiting for a loaded stack
    LEARNER_GRAD = "learner_grad"  # one SGD step (under the learner's lock)
    LEARNER_THREAD = (LEARNER_QUEUE_WAIT, LEARNER_LOAD, LEARNER_LOAD_WAIT, LEARNER_GRAD)


class Timers:
    """Wall time per named phase (thread-safe), reported as ``timers/<name>_ms``.

    Without ``window``: the mean milliseconds of each phase timed since the last ``report()``
    (the driver's per-iteration timers; a phase not timed since is left out). With
    ``window=N``: the mean of each phase's last N events, every name in ``names`` reported (0
    before its first event); a learner thread's timers, read by the driver at any moment.
    """

    def __init__(self, names: tuple[str, ...] = (), window: int | None = None) -> None:
        self._lock = threading.Lock()
        self.window = window
        self._times: dict[str, deque[float]] = {n: deque(maxlen=window) for n in names}

    @contextmanager
    def time(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            times = self._times.get(name)
            if times is None:
                times = self._times[name] = deque(maxlen=self.window)
            times.append(seconds)

    def report(self) -> dict[str, float]:
        with self._lock:
            out = {
                f"timers/{k}_ms": 1000.0 * float(np.mean(v)) if v else 0.0
                for k, v in self._times.items()
                if v or self.window is not None
            }
            if self.window is None:
                self._times.clear()
        return out
