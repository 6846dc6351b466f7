"""The Ape-X learner thread: learns on replayed batches in the background.

The driver puts ``(shard_id, batch)`` on a bounded in-queue without blocking; the thread
runs ``learn_fn(batch) -> (priorities, stats)`` (one SGD step) and puts
``(shard_id, indices, priorities, env_steps, stats)`` on the out-queue, so the driver can
send the new priorities back to the shard the batch came from. ``get_weights()`` and
``learn_fn`` hold the same lock, so a weight broadcast never sees a half-applied step.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable

import numpy as np

from shoal.batch import Batch, Col
from shoal.learn.threads import BackgroundLearnerThread


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

    def add(self, shard_id: int, batch: Batch) -> bool:
        """Queue a replayed batch without blocking; False (and counted) when the queue is full."""
        try:
            self.inqueue.put_nowait((shard_id, batch))
            return True
        except queue.Full:
            self.num_dropped += 1
            return False

    def step(self) -> None:
        with self.idle():
            try:
                shard_id, batch = self.inqueue.get(timeout=0.2)
            except queue.Empty:
                return
        t0 = time.perf_counter()
        with self.lock:
            priorities, stats = self.learn_fn(batch)
            self.num_updates += 1
        self.grad_time_s += time.perf_counter() - t0
        self.outqueue.put((shard_id, batch[Col.INDICES], priorities, len(batch), stats))

    def drain(self) -> list[tuple[int, np.ndarray, np.ndarray, int, dict[str, Any]]]:
        """Everything the thread has finished so far (never blocks)."""
        out = []
        while True:
            try:
                out.append(self.outqueue.get_nowait())
            except queue.Empty:
                return out

    def get_weights(self) -> dict:
        with self.lock:
            return self.get_weights_fn()
