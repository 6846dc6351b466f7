"""Per-policy replay of whole batches: the replay actor of a learner shard
(:class:`shoal.learn.DistributedLearners`), mixing new batches with replayed ones."""

from __future__ import annotations

import math
from collections import deque
from typing import Hashable

import numpy as np

from shoal.batch import Batch
from shoal.errors import ConfigError

PolicyId = Hashable


def num_to_replay(num_new: int, replay_ratio: float, carry: float = 0.0) -> tuple[int, float]:
    """How many stored batches to mix with ``num_new`` new ones so that, in the long run, a
    fraction ``replay_ratio`` of the batches learned on are replayed; returns (count, new carry).

    ``replay_ratio`` 0 learns only on new batches, 0.5 on one replayed per new one; the
    fractional remainder carries over to the next call.
    """
    want = num_new * replay_ratio / (1.0 - replay_ratio) + carry
    k = int(math.floor(want + 1e-9))
    return k, want - k


class BatchReplay:
    """Per-policy replay of whole batches: new batches wait until a learner asks for them,
    then join a ring of ``capacity`` batches from which older ones are replayed.

    ``replay(policy_id)`` returns the oldest waiting new batch concatenated with replayed
    ones (see :func:`num_to_replay`), or None when nothing is waiting. With ``replay_ratio``
    1 it returns one stored batch (new batches go straight to the ring). At most
    ``capacity`` new batches wait; older waiting ones move to the ring unlearned.
    """

    def __init__(self, capacity: int = 10, replay_ratio: float = 0.0, seed: int | None = None) -> None:
        if capacity < 1:
            raise ConfigError(f"replay capacity={capacity}: the replay buffer must hold at least 1 batch")
        if not 0.0 <= replay_ratio <= 1.0:
            raise ConfigError(
                f"replay_ratio={replay_ratio}: must be between 0 (only new batches) and 1 (only replayed ones)"
            )
        self.capacity, self.replay_ratio = capacity, replay_ratio
        self.rng = np.random.default_rng(seed)
        self.new: dict[PolicyId, deque[Batch]] = {}
        self.stored: dict[PolicyId, deque[Batch]] = {}
        self.carry: dict[PolicyId, float] = {}
        self.counts: dict[PolicyId, dict[str, int]] = {}

    def ping(self) -> bool:
        return True

    def _count(self, policy_id: PolicyId, key: str, n: int = 1) -> None:
        c = self.counts.setdefault(policy_id, {"added": 0, "learned_new": 0, "replayed": 0})
        c[key] += n

    def add_batch(self, policy_id: PolicyId, batch: Batch) -> None:
        waiting = self.new.setdefault(policy_id, deque())
        stored = self.stored.setdefault(policy_id, deque(maxlen=self.capacity))
        self._count(policy_id, "added")
        if self.replay_ratio >= 1.0:
            stored.append(batch)
            return
        waiting.append(batch)
        if len(waiting) > self.capacity:
            stored.append(waiting.popleft())

    def replay(self, policy_id: PolicyId) -> Batch | None:
        stored = self.stored.get(policy_id)
        if self.replay_ratio >= 1.0:
            if not stored:
                return None
            self._count(policy_id, "replayed")
            return stored[int(self.rng.integers(len(stored)))]
        waiting = self.new.get(policy_id)
        if not waiting:
            return None
        batch = waiting.popleft()
        k, self.carry[policy_id] = num_to_replay(1, self.replay_ratio, self.carry.get(policy_id, 0.0))
        old = [stored[int(i)] for i in self.rng.integers(len(stored), size=k)] if stored and k else []
        stored.append(batch)
        self._count(policy_id, "learned_new")
        self._count(policy_id, "replayed", len(old))
        return Batch.concat([batch, *old]) if old else batch

    def remove_policy(self, policy_id: PolicyId) -> None:
        for d in (self.new, self.stored, self.carry, self.counts):
            d.pop(policy_id, None)

    def stats(self) -> dict[PolicyId, dict[str, int]]:
        return {
            pid: {**c, "waiting": len(self.new.get(pid, ())), "stored": len(self.stored.get(pid, ()))}
            for pid, c in self.counts.items()
        }


__all__ = ["BatchReplay", "num_to_replay"]
