"""LearnerThread: the background learner of IMPALA / APPO (single device).

The driver puts train batches on a bounded in-queue with ``add()`` (never blocking: a full
queue answers False and counts a drop, :class:`~shoal.learn.threads.LearnerThreadBase`). The thread takes them in order, moves
each to the learner's device once ("load"), and keeps them in a ring of
``minibatch_buffer_size`` slots: every step learns on the current slot and moves to the next
one; an empty slot is refilled from the in-queue. Each batch is learned ``num_sgd_iter``
times in all, interleaved with the other batches in the ring, and then released: its
:class:`~shoal.learn.threads.LearnerResult` goes on the out-queue, ``stats`` holding the mean
of the loss statistics over its passes.

With ``minibatch_buffer_size=1`` a batch is learned ``num_sgd_iter`` times in a row; with
``minibatch_buffer_size=2, num_sgd_iter=2`` the order is b1 b2 b1 b2 b3 b4 b3 b4 ...

Multi-agent: pass ``{policy_id: Learner}`` and put ``{policy_id: Batch}``; one SGD step
updates every policy present in the batch, and the batch becomes one result per policy
(``LearnerResult.policy_id``; None for a single policy's thread). A result's env steps are its
batch's valid rows (sequences keep reset rows, masked out). A subclass whose items carry more
(the learner group's) unpacks them in ``unpack``.

The thread never spins: it blocks in ``queue.get`` (inside ``idle()``, so the idle fraction
is exact). If the in-queue stays empty for ``learner_queue_timeout`` seconds the thread ends
with :class:`LearnerQueueTimeout`; that, or any exception from the loss, reaches the driver
through ``check()`` as a ``LearnerThreadError`` carrying the cause and its traceback.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Mapping

import numpy as np

from shoal.batch import Batch
from shoal.errors import ConfigError
from shoal.learn.learner import Learner
from shoal.learn.stats import StatsMean
from shoal.learn.threads import LearnerThreadBase, wait_get
from shoal.logging.metrics import Phase, Timers


def policy_steps(batch, env_steps: int | None = None) -> dict[Any, tuple[int, int]]:
    """Each policy's (env steps, agent steps) in a Batch (policy None) or a ``{policy_id: Batch}``:
    its valid rows and its rows. ``env_steps`` replaces a single Batch's valid-row count."""
    if isinstance(batch, Batch):
        return {None: (batch.valid_rows() if env_steps is None else int(env_steps), len(batch))}
    return {pid: (b.valid_rows(), len(b)) for pid, b in batch.items()}


def _positive(name: str, value, kind=int) -> None:
    if not isinstance(value, (int, float)) or value <= 0 or (kind is int and int(value) != value):
        what = "a positive integer" if kind is int else "a positive number of seconds"
        raise ConfigError(f"{name}={value!r} is not allowed: it must be {what}.")


class _Slot:
    __slots__ = ("tensors", "steps", "ttl", "stats")

    def __init__(self, tensors: dict, steps: dict[Any, tuple[int, int]], ttl: int) -> None:
        self.tensors, self.steps, self.ttl = tensors, steps, ttl
        self.stats = {pid: StatsMean() for pid in tensors}  # each policy's, over the batch's passes


class LearnerThread(LearnerThreadBase):
    def __init__(
        self,
        learner: Learner | Mapping[str, Learner],
        *,
        learner_queue_size: int = 16,
        minibatch_buffer_size: int = 1,
        num_sgd_iter: int = 1,
        learner_queue_timeout: float = 300.0,
        name: str = "shoal-learner",
    ) -> None:
        _positive("learner_queue_size", learner_queue_size)
        _positive("minibatch_buffer_size", minibatch_buffer_size)
        _positive("num_sgd_iter", num_sgd_iter)
        _positive("learner_queue_timeout", learner_queue_timeout, float)
        super().__init__(learner_queue_size, name)
        self.multi_agent = not isinstance(learner, Learner)
        self.learners: dict[Any, Learner] = {None: learner} if isinstance(learner, Learner) else dict(learner)
        if not self.learners:
            raise ConfigError("the learner thread needs at least one Learner (got an empty dict).")
        self.departed: set[Any] = set()  # policies removed while running: their batches in flight are skipped
        self.num_sgd_iter = int(num_sgd_iter)
        self.learner_queue_timeout = float(learner_queue_timeout)
        self.timers = Timers(Phase.LEARNER_THREAD, window=100)
        self.queue_sizes: deque[int] = deque(maxlen=100)
        self._ring: list[_Slot | None] = [None] * int(minibatch_buffer_size)
        self._idx = 0

    # ---- driver side -------------------------------------------------------------------
    def add(self, batch) -> bool:
        """Offer one train batch (checked first); False, and counted in ``num_dropped``, when the queue is full."""
        self.validate(batch)
        return self.offer(batch)

    def validate(self, batch) -> None:
        """Cheap checks on a batch before it is queued (subclasses add their own)."""
        if self.multi_agent != (not isinstance(batch, Batch)):
            raise TypeError(
                f"this learner thread is {'multi' if self.multi_agent else 'single'}-agent but got a "
                f"{type(batch).__name__}; put a {'dict of policy_id -> Batch' if self.multi_agent else 'Batch'}"
            )

    def add_learner(self, policy_id: str, learner: Learner) -> None:
        """A policy joins a running multi-agent thread; its batches may come in the next items."""
        if not self.multi_agent:
            raise ValueError("a single-policy learner thread takes no other policy")
        with self.lock:  # one swap between two steps: a step iterates the dict it started with
            self.departed.discard(policy_id)
            self.learners = {**self.learners, policy_id: learner}

    def remove_learner(self, policy_id: str) -> None:
        """A policy leaves a running multi-agent thread: its learner goes, and its batches still in the
        queue or the ring are skipped (no result for them), not learned."""
        with self.lock:
            self.departed.add(policy_id)
            self.learners = {pid: ln for pid, ln in self.learners.items() if pid != policy_id}

    def get_weights(self, policy_id=None) -> dict[str, Any]:
        """A copy of the current weights (of ``policy_id``; of every policy, keyed by id, when
        it is None in a multi-agent thread). Safe to call while the thread trains."""
        with self.hold():
            if not self.multi_agent:
                return self.learners[None].get_weights()
            if policy_id is None:
                return {pid: ln.get_weights() for pid, ln in self.learners.items()}
            return self.learners[policy_id].get_weights()

    def stats(self) -> dict[str, float]:
        """Queue-size window, phase timers, idle fraction (since the last call) and update count."""
        sizes = list(self.queue_sizes)
        return {
            "learner_queue_size_mean": float(np.mean(sizes)) if sizes else 0.0,
            "learner_queue_size_max": float(max(sizes)) if sizes else 0.0,
            **self.timers.report(),
            "learner_idle_fraction": 1.0 - self.busy_fraction(),
            "num_updates": float(self.num_updates),
        }

    # ---- thread side -------------------------------------------------------------------
    def take(self, stopped: threading.Event, idle) -> tuple[Any, dict[Any, tuple[int, int]]] | None:
        """Next in-queue item as (batch, each policy's (env steps, agent steps)); None once stopped.

        ``idle`` is the idle() context of the thread that waits (the learner or a loader).
        """
        with idle(), self.timers.time(Phase.LEARNER_QUEUE_WAIT):
            item = wait_get(self.inqueue, stopped, self.learner_queue_timeout)
        if item is None:
            return None
        self.queue_sizes.append(self.inqueue.qsize())
        batch, env_steps = self.unpack(item)
        return batch, policy_steps(batch, env_steps)

    def unpack(self, item) -> tuple[Any, int | None]:
        """An in-queue item as (batch, env_steps or None); a subclass may carry more in its items."""
        return item, None

    def step(self) -> None:
        slot = self._ring[self._idx]
        if slot is None:
            item = self.take(self.stopped, self.idle)
            if item is None:
                return
            batch, steps = item
            with self.timers.time(Phase.LEARNER_LOAD):
                tensors = {pid: self._load(pid, b) for pid, b in self._per_policy(batch)}
            slot = self._ring[self._idx] = _Slot(tensors, steps, self.num_sgd_iter)
        with self.lock, self.timers.time(Phase.LEARNER_GRAD):
            for pid, tensors in slot.tensors.items():
                if pid in self.learners:  # else it left while its batch was in the ring
                    slot.stats[pid].add(self.learners[pid].update_minibatch(tensors))
            self.num_updates += 1
        self.yield_to_readers()
        slot.ttl -= 1
        if slot.ttl == 0:
            self._ring[self._idx] = None
            self.publish_round(slot.steps, slot.stats)
        self._idx = (self._idx + 1) % len(self._ring)

    # ---- helpers shared with the multi-device thread -----------------------------------
    def _per_policy(self, batch):
        items = batch.items() if self.multi_agent else [(None, batch)]
        for pid, b in items:
            if pid in self.departed:
                continue  # removed after this batch was queued
            if pid not in self.learners:
                raise KeyError(
                    f"the batch holds policy '{pid}' but the learner thread has learners only for "
                    f"{sorted(map(str, self.learners))}"
                )
            yield pid, b

    def _load(self, pid, batch: Batch) -> dict:
        return batch.to_torch(self.learners[pid].device)
