"""The Ape-X learner thread: learns on replayed batches in the background.

The driver offers :class:`Replayed` batches through ``add()`` without blocking (through a
:class:`~shoal.framework.runner.ThreadRunner`, which reports each result under the policy's id). With a
``load_fn``, a loader thread takes them from that queue, moves each batch onto the learner's
device (:func:`~shoal.learn.loading.copy_to_device`: pinned memory and a copy stream on CUDA) and
keeps up to ``prefetch`` of them ready, so the learning thread finds its next batch on the device
and spends its time on SGD steps only; ``learn_fn(tensors) -> (priorities, stats)`` then takes
the loaded tensors. Without one, ``learn_fn(batch)`` gets the host batch and loads it itself.
Either way each step publishes a :class:`~shoal.learn.threads.LearnerResult` carrying the new
priorities and the batch's :class:`~shoal.learn.threads.ReplayTag`, so the driver can send the
priorities back to the shard the batch came from. The tag holds the batch's slots and row ids
(the shard drops priorities of slots overwritten since) and the shard's generation when it was
sampled (the driver drops all of them if the shard has been recreated since). ``learn_fn`` runs
under the thread's lock, like every learner thread's step
(:class:`~shoal.learn.threads.LearnerThreadBase`). The learning thread's busy share counts SGD
steps only: waiting for the loader is idle time.
"""

from __future__ import annotations

import queue
import time
from typing import Any, Callable, NamedTuple

import numpy as np

from shoal.batch import Batch, Col
from shoal.learn.threads import BackgroundThread, LearnerResult, LearnerThreadBase, ReplayTag, put_stop, wait_get


class _Loader(BackgroundThread):
    """Moves offered batches onto the device, ahead of the learning thread."""

    def __init__(self, owner: ReplayLearnerThread) -> None:
        super().__init__(name="shoal-replay-loader")
        self.owner = owner

    def step(self) -> None:
        owner = self.owner
        with self.idle():
            item = wait_get(owner.inqueue, self.stopped)
        if item is None:
            return
        tag, batch = item
        assert owner.load_fn is not None
        ready = (tag, len(batch), owner.load_fn(batch))
        with self.idle():  # a full ready queue: the learner is the slower side
            while not self.stopped.is_set():
                try:
                    owner.ready.put(ready, timeout=0.5)
                    return
                except queue.Full:
                    continue


class Replayed(NamedTuple):
    """A batch replayed from shard ``shard_id`` at its restart ``generation``: what the thread learns
    on, and where the batch's new priorities go."""

    shard_id: int
    generation: int
    batch: Batch


class ReplayLearnerThread(LearnerThreadBase):
    multi_agent = False  # one policy (a runner reports its results under that policy's id)

    def __init__(
        self,
        learn_fn: Callable[[Any], tuple[np.ndarray | None, dict]],
        get_weights_fn: Callable[[], dict],
        queue_size: int = 16,
        load_fn: Callable[[Batch], Any] | None = None,
        prefetch: int = 2,
    ) -> None:
        super().__init__(queue_size, name="shoal-replay-learner")
        if prefetch < 1:
            raise ValueError(f"prefetch must be at least 1; got {prefetch}")
        self.learn_fn = learn_fn
        self.get_weights_fn = get_weights_fn
        self.load_fn = load_fn
        self.ready: queue.Queue = queue.Queue(maxsize=int(prefetch))
        self.loader = _Loader(self) if load_fn is not None else None
        self.grad_time_s = 0.0
        self._accepted = 0  # offers taken onto the in-queue
        self._done = 0  # of those, learned (the rest are queued, loading or loaded)

    def offer(self, item) -> bool:
        ok = super().offer(item)
        self._accepted += ok
        return ok

    def queued(self) -> int:
        """Batches offered and not yet learned: in the queue, in the loader or loaded and waiting."""
        return self._accepted - self._done

    def add(self, replayed: Replayed) -> bool:
        """Offer a replayed batch; False (and counted in ``num_dropped``) when the queue is full."""
        batch = replayed.batch
        tag = ReplayTag(replayed.shard_id, replayed.generation, batch[Col.INDICES], batch.data.get(Col.ROW_IDS))
        return self.offer((tag, batch))

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        if self.loader is not None:
            self.loader.start()
        super().start()

    def check(self) -> None:
        if self.loader is not None:
            self.loader.check()
        super().check()

    def stop(self, timeout_s: float = 5.0) -> None:
        self.stopped.set()
        if self.loader is not None:
            self.loader.stopped.set()
            put_stop(self.inqueue)
            put_stop(self.ready)
            self.loader.stop(timeout_s)
        super().stop(timeout_s)

    # ---- learning ----------------------------------------------------------------------
    def step(self) -> None:
        with self.idle():
            item = wait_get(self.ready if self.loader is not None else self.inqueue, self.stopped)
        if item is None:
            return
        if self.loader is not None:
            tag, rows, data = item
        else:
            tag, data = item
            rows = len(data)
        t0 = time.perf_counter()
        with self.lock:
            priorities, stats = self.learn_fn(data)
            self.num_updates += 1
            self._done += 1
        self.grad_time_s += time.perf_counter() - t0
        self.yield_to_readers()
        self.publish(LearnerResult(rows, rows, stats, priorities, tag))

    def get_weights(self) -> dict:
        with self.hold():
            return self.get_weights_fn()
