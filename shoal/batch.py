"""Batch: named columns of numpy arrays sharing their first dimension.

Column names are the constants of :class:`Col`; code refers to ``Col.OBS`` and never to a
string literal, so a misspelt column is an AttributeError at import time, not a silent
KeyError deep in a learner.
"""

from __future__ import annotations

from typing import Iterator, Mapping, Sequence

import numpy as np


class Col:
    """Column names used across rollout, replay and learners."""

    OBS = "obs"
    NEXT_OBS = "next_obs"
    ACTIONS = "actions"
    REWARDS = "rewards"
    TERMINATEDS = "terminateds"  # the MDP ended: no bootstrap
    TRUNCATEDS = "truncateds"  # cut by a time limit: bootstrap from the next observation's value
    ACTION_LOGP = "action_logp"
    ACTION_DIST_INPUTS = "action_dist_inputs"
    VF_PREDS = "vf_preds"
    ADVANTAGES = "advantages"
    VALUE_TARGETS = "value_targets"
    WEIGHTS = "weights"  # importance-sampling weights from prioritized replay
    INDICES = "indices"  # replay buffer slots, to send new priorities back
    ROW_IDS = "row_ids"  # replay: the sampled rows' add order, so a priority for an overwritten slot is dropped
    Q_VALUES = "q_values"  # Q(s, .) for every action, recorded by Q-learning policies while acting
    PRIORITIES = "priorities"  # initial replay priorities computed on the rollout worker
    DISCOUNTS = "discounts"  # gamma ** k for a k-step transition (0 after termination is not folded in)
    VALID = "valid"  # False on next-step autoreset rows kept in time-major sequences (IMPALA / APPO)
    ACTION_MASK = "action_mask"  # bool per action: legal actions when it was sampled (the learner masks the same)
    NEXT_ACTION_MASK = "next_action_mask"  # bool per action: legal actions at NEXT_OBS (Q-learning's target max)
    STATE_IN = "state_in"  # recurrent state at each sequence's start, packed over its rows (shoal.models.recurrent)
    BOOTSTRAP_OBS = (
        "bootstrap_obs"  # the observation after each sequence's last row, packed over its rows (IMPALA / APPO)
    )


def pack_per_sequence(values: np.ndarray, seq_len: int) -> np.ndarray:
    """``(S, *shape)`` values, one per sequence of ``seq_len`` rows -> ``(S * seq_len, width)`` rows of the
    same dtype, each value flattened and spread over its sequence's rows (zero-padded), so a
    per-sequence value rides in a row column and whole-sequence minibatches keep it.

    A sequence's bootstrap frame costs one frame over ``seq_len`` rows this way, where a
    next-observation column would cost ``seq_len`` frames.
    """
    n = len(values)
    flat = values.reshape(n, -1)
    width = -(-flat.shape[1] // seq_len)
    out = np.zeros((n, seq_len * width), dtype=values.dtype)
    out[:, : flat.shape[1]] = flat
    return out.reshape(n * seq_len, width)


def unpack_per_sequence(rows, seq_len: int, shape: Sequence[int]):
    """The inverse of :func:`pack_per_sequence` (numpy arrays or torch tensors): ``(S * seq_len, width)``
    rows -> ``(S, *shape)``."""
    size = int(np.prod(shape, dtype=np.int64))
    return rows.reshape(-1, seq_len * rows.shape[1])[:, :size].reshape(-1, *shape)


class Batch:
    """A dict-like set of equally long numpy columns."""

    __slots__ = ("data",)

    def __init__(self, data: Mapping[str, np.ndarray] | None = None) -> None:
        self.data: dict[str, np.ndarray] = {}
        n = None
        for k, v in (data or {}).items():
            v = np.asarray(v)
            if n is None:
                n = len(v)
            elif len(v) != n:
                raise ValueError(f"Batch column '{k}' has {len(v)} rows, expected {n}")
            self.data[k] = v

    # ---- mapping -----------------------------------------------------------------------
    def __len__(self) -> int:
        for v in self.data.values():
            return len(v)
        return 0

    def valid_rows(self) -> int:
        """The env steps these rows train on: the rows, less the reset rows sequences keep (``Col.VALID``)."""
        return int(np.count_nonzero(self.data[Col.VALID])) if Col.VALID in self.data else len(self)

    def __getitem__(self, key: str) -> np.ndarray:
        return self.data[key]

    def __setitem__(self, key: str, value: np.ndarray) -> None:
        value = np.asarray(value)
        if self.data and len(value) != len(self):
            raise ValueError(f"Batch column '{key}' has {len(value)} rows, expected {len(self)}")
        self.data[key] = value

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def keys(self):
        return self.data.keys()

    def items(self):
        return self.data.items()

    def __repr__(self) -> str:
        cols = ", ".join(f"{k}{tuple(v.shape)}" for k, v in self.data.items())
        return f"Batch(len={len(self)}, {cols})"

    # ---- operations --------------------------------------------------------------------
    @staticmethod
    def concat(batches: Sequence["Batch"]) -> "Batch":
        batches = [b for b in batches if len(b)]
        if not batches:
            return Batch()
        keys = batches[0].keys()
        for b in batches[1:]:
            if b.keys() != keys:
                raise ValueError(f"cannot concat batches with columns {sorted(keys)} and {sorted(b.keys())}")
        return Batch({k: np.concatenate([b.data[k] for b in batches]) for k in keys})

    def slice(self, start: int, stop: int) -> "Batch":
        return Batch({k: v[start:stop] for k, v in self.data.items()})

    def take(self, idx: np.ndarray) -> "Batch":
        return Batch({k: v[idx] for k, v in self.data.items()})

    def minibatches(
        self, size: int, rng: np.random.Generator | None = None, drop_last: bool = False
    ) -> Iterator["Batch"]:
        """Yield minibatches of ``size`` rows, shuffled when ``rng`` is given.

        The last, smaller minibatch is kept unless ``drop_last``.
        """
        n = len(self)
        if size <= 0:
            raise ValueError("minibatch size must be positive")
        order = rng.permutation(n) if rng is not None else np.arange(n)
        for start in range(0, n, size):
            idx = order[start : start + size]
            if drop_last and len(idx) < size:
                return
            yield self.take(idx)

    def to_torch(self, device="cpu", exclude: Sequence[str] = ()) -> dict:
        """Columns (less ``exclude``) as torch tensors on ``device`` (zero-copy on CPU where possible)."""
        import torch

        out = {}
        for k, v in self.data.items():
            if k in exclude:
                continue
            if not v.flags.writeable:  # e.g. zero-copy arrays from Ray's object store
                v = v.copy()
            t = torch.from_numpy(np.ascontiguousarray(v))
            out[k] = t.to(device, non_blocking=True) if str(device) != "cpu" else t
        return out
