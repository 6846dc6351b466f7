"""The Ape-X learner thread: learns on replayed batches in the background.

The driver puts ``(shard_id, generation, batch)`` on a bounded in-queue without blocking;
the thread runs ``learn_fn(batch) -> (priorities, stats)`` (one SGD step) and puts a
:class:`ReplayResult` on the out-queue, so the driver can send the new priorities back to
the shard the batch came from. The batch's slots and row ids travel with the priorities
(the shard drops those of slots overwritten since), and so does the shard's generation at
the time it was sampled (the driver drops all of them if the shard has been recreated
since). ``get_weights()`` and ``learn_fn`` hold the same lock, so a weight broadcast never
sees a half-applied step.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, NamedTuple

import numpy as np

from shoal.batch import Batch, Col
from shoal.learn.threads import BackgroundLearnerThread


class ReplayResult(NamedTuple):
    """One learned batch: where it came from and its new priorities."""

    shard_id: int
    generation: int  # the shard's restart generation when the batch was sampled
    indices: np.ndarray  # Col.INDICES: the slots
    row_ids: np.ndarray | None  # Col.ROW_IDS: which rows the slots held
    priorities: np.ndarray
    env_steps: int
    stats: dict[str, Any]


class ReplayLearnerThread(BackgroundLearnerThread):
    def __init__(self, learn_fn: Callable[[Batch], tuple[np.ndarray, dict]], get_weights_fn: Callable[[], dict],
                 queue_size: int = 16) -> None:
        super().__init__(name="shoal-replay-learner")
        self.learn_fn = learn_fn
        self.get_weights_fn = get_weights_fn
        self.inqueue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.outqueue: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.num_updates = 0
        self.num_dropped = 0  # batches refused because the in-queue was full
        self.grad_time_s = 0.0

    def add(self, shard_id: int, batch: Batch, generation: int = 0) -> bool:
        """Queue a replayed batch without blocking; False (and counted) when the queue is full."""
        try:
            self.inqueue.put_nowait((shard_id, generation, batch))
            return True
        except queue.Full:
            self.num_dropped += 1
            return False

    def step(self) -> None:
        with self.idle():
            try:
                shard_id, generation, batch = self.inqueue.get(timeout=0.2)
            except queue.Empty:
                return
        t0 = time.perf_counter()
        with self.lock:
            priorities, stats = self.learn_fn(batch)
            self.num_updates += 1
        self.grad_time_s += time.perf_counter() - t0
        self.outqueue.put(ReplayResult(shard_id, generation, batch[Col.INDICES], batch.data.get(Col.ROW_IDS),
                                       priorities, len(batch), stats))

    def drain(self, timeout_s: float = 0.0) -> list[ReplayResult]:
        """Everything the thread has finished so far, waiting up to ``timeout_s`` for a first one."""
        out = []
        try:
            if timeout_s > 0:
                out.append(self.outqueue.get(timeout=timeout_s))
            while True:
                out.append(self.outqueue.get_nowait())
        except queue.Empty:
            return out

    def get_weights(self) -> dict:
        with self.lock:
            return self.get_weights_fn()
