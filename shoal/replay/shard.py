"""ReplayShard: one replay buffer behind the small interface the algorithms call.

A plain class; ``shoal.runtime`` wraps it as a Ray actor when replay is distributed (Ape-X
places several beside the learner). In-process it is used as is.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from shoal.batch import Batch, Col
from shoal.errors import ConfigError
from shoal.replay.buffers import PrioritizedReplayBuffer, ReplayBuffer, _non_negative


class ReplayShard:
    """A uniform or prioritized buffer that counts what passes through it.

    With ``prioritized=False`` the priorities given to ``add`` and ``update_priorities`` are
    ignored and ``sample`` returns weights of 1, so callers need not tell the two apart.
    Calls are serialized by a lock, so threads (or a threaded actor) may share a shard; the
    buffers themselves are not thread-safe (their numba kernels release the GIL).

    ``compression`` and ``memory_share`` go to the buffer. ``retain_freed_memory`` applies
    :func:`shoal.process.retain_freed_memory` to this process: a sample of 512 compressed
    Atari rows fills two fresh 14 MB arrays, and without it each is new pages (page faults). If the buffer refuses the first
    add with a ConfigError (it would not fit in memory, or lz4 is missing), ``add`` raises it
    that once and afterwards stores nothing and returns 0, and ``sample`` answers with the
    error instead of a batch: rollout actors add without waiting for an answer, so the
    driver learns of it from its next sample request (raising it inside a Ray actor would
    read as a crash and recreate the shard).
    """

    def __init__(
        self,
        capacity: int,
        prioritized: bool = True,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        seed: int | None = None,
        compression: str = "none",
        memory_share: float = 1.0,
        retain_freed_memory: bool = False,
    ) -> None:
        if retain_freed_memory:
            from shoal.process import retain_freed_memory as retain

            retain()
        self.prioritized = bool(prioritized)
        store = {"seed": seed, "compression": compression, "memory_share": memory_share}
        if self.prioritized:
            self.buffer: ReplayBuffer = PrioritizedReplayBuffer(capacity, alpha=alpha, beta=beta, eps=eps, **store)
        else:
            self.buffer = ReplayBuffer(capacity, **store)
        self.counts = {"added": 0, "sampled": 0, "updated": 0, "stale": 0}
        self.refused: ConfigError | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.buffer)

    def ping(self) -> bool:
        return True

    def add(self, batch: Batch, priorities: np.ndarray | None = None) -> int:
        """Store the batch's rows; returns how many rows were given (0 once the buffer has refused them)."""
        with self._lock:
            if self.refused is not None:
                return 0
            try:
                if self.prioritized:
                    self.buffer.add(batch, priorities)
                else:
                    self.buffer.add(batch)
            except ConfigError as e:
                self.refused = e
                raise
            self.counts["added"] += len(batch)
        return len(batch)

    def sample(self, n: int, beta: float | None = None) -> Batch | ConfigError | None:
        """``n`` rows with ``Col.WEIGHTS``, ``Col.INDICES`` and ``Col.ROW_IDS``, None while the
        shard is empty, or the ConfigError with which the buffer refused the rows."""
        with self._lock:
            if self.refused is not None:
                return self.refused
            if len(self.buffer) == 0:
                return None
            if self.prioritized:
                out = self.buffer.sample(n, beta)
            else:
                out = self.buffer.sample(n)
                out.data[Col.WEIGHTS] = np.ones(len(out), dtype=np.float32)
            self.counts["sampled"] += len(out)
        return out

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray, row_ids: np.ndarray | None = None) -> int:
        """New priorities for sampled slots; with ``row_ids`` (``Col.ROW_IDS``) those of slots
        overwritten since they were sampled are dropped (counted in ``stale``). Returns how many were set."""
        with self._lock:
            n = len(indices)
            if self.prioritized:
                n = self.buffer.update_priorities(indices, priorities, row_ids)
            self.counts["updated"] += n
            self.counts["stale"] += len(indices) - n
        return n

    def set_beta(self, beta: float) -> None:
        if self.prioritized:
            self.buffer.beta = _non_negative("beta", beta)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"size": len(self.buffer), "capacity": self.buffer.capacity, **self.counts}
        if self.prioritized:
            out["max_priority"] = self.buffer.max_priority
            out["beta"] = self.buffer.beta
        return out

    def get_state(self) -> dict[str, Any]:
        with self._lock:
            return {"prioritized": self.prioritized, "counts": dict(self.counts), "buffer": self.buffer.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        if bool(state["prioritized"]) != self.prioritized:
            raise ValueError(
                f"replay state is {'' if state['prioritized'] else 'not '}prioritized, this shard is "
                f"{'' if self.prioritized else 'not '}prioritized"
            )
        with self._lock:
            self.buffer.set_state(state["buffer"])
            self.counts = {k: int(state["counts"].get(k, 0)) for k in self.counts}
