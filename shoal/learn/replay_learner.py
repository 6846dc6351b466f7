"""The Ape-X learner thread: learns on replayed batches in the background.

The driver offers ``(ReplayTag, batch)`` items through ``add()`` without blocking; the thread
runs ``learn_fn(batch) -> (priorities, stats)`` (one SGD step) and publishes a
:class:`~shoal.learn.threads.LearnerResult` carrying the new priorities and the batch's
:class:`~shoal.learn.threads.ReplayTag`, so the driver can send the priorities back to the
shard the batch came from. The tag holds the batch's slots and row ids (the shard drops
priorities of slots overwritten since) and the shard's generation when it was sampled (the
driver drops all of them if the shard has been recreated since). ``learn_fn`` runs under the
thread's lock, like every learner thread's step (:class:`~shoal.learn.threads.LearnerThreadBase`).
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from shoal.batch import Batch, Col
from shoal.learn.threads import LearnerResult, LearnerThreadBase, ReplayTag, wait_get


class ReplayLearnerThread(LearnerThreadBase):
    def __init__(
        self,
        learn_fn: Callable[[Batch], tuple[np.ndarray | None, dict]],
        get_weights_fn: Callable[[], dict],
        queue_size: int = 16,
    ) -> None:
        super().__init__(queue_size, name="shoal-replay-learner")
        self.learn_fn = learn_fn
        self.get_weights_fn = get_weights_fn
        self.grad_time_s = 0.0

    def add(self, shard_id: int, batch: Batch, generation: int = 0) -> bool:
        """Offer a batch replayed from ``shard_id``; False (and counted in ``num_dropped``) when the queue is full."""
        tag = ReplayTag(shard_id, generation, batch[Col.INDICES], batch.data.get(Col.ROW_IDS))
        return self.offer((tag, batch))

    def step(self) -> None:
        with self.idle():
            item = wait_get(self.inqueue, self.stopped)
        if item is None:
            return
        tag, batch = item
        t0 = time.perf_counter()
        with self.lock:
            priorities, stats = self.learn_fn(batch)
            self.num_updates += 1
        self.grad_time_s += time.perf_counter() - t0
        self.yield_to_readers()
        self.publish(LearnerResult(len(batch), len(batch), stats, priorities, tag))

    def get_weights(self) -> dict:
        with self.hold():
            return self.get_weights_fn()
