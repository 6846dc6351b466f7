"""Where every seed in a run comes from: one base ``config.seed`` and named derivations.

A run with ``seed: s`` seeds torch, numpy and Python's ``random`` with ``s`` in the driver.
Everything else that draws random numbers gets its own stream, derived here so that no two
streams collide and no offset is a bare number somewhere in the code:

- rollout worker ``i`` (the driver's own runner is 0): ``s + WORKER_STRIDE * i``; its
  vector envs take consecutive seeds from there (sub-env ``j``: ``+ j``), so a stride larger
  than any vector keeps two workers' envs apart;
- a runner's evaluation envs and scripted opponents: its own seed ``+ EVALUATION_OFFSET``;
- evaluation runners use the worker indices ``EVAL_RUNNER_INDEX`` (in the driver) and
  ``EVAL_ACTORS_FIRST_INDEX + i`` (evaluation actors), far from the rollout actors' 1..N;
- indexed components of one kind (replay shard ``i``, DD-PPO replica ``i``'s minibatch
  order): ``s + COMPONENT_STRIDE * i``;
- a league policy ``p``'s initial weights and sampling noise: ``+ policy_offset(p)``, a
  hash of its id (the same on every worker, whatever order policies were added in).

``None`` stays ``None`` everywhere: an unseeded run draws fresh entropy.
"""

from __future__ import annotations

import zlib
from typing import Optional

WORKER_STRIDE = 10_007  # prime, larger than any vector of envs one worker runs
EVALUATION_OFFSET = 7_919  # prime, below WORKER_STRIDE: never another worker's stream
COMPONENT_STRIDE = 7
EVAL_RUNNER_INDEX = 999
EVAL_ACTORS_FIRST_INDEX = 1000
MAX_SEED = 2**31 - 2**24 - 1
"""The largest ``seed``: every seed derived from it (a few million above at most) stays below
2**31, which ALE, Gymnasium and numpy's legacy seeding all take."""


def derive_seed(seed: Optional[int], *, index: int = 0, stride: int = 0, offset: int = 0) -> Optional[int]:
    """``seed + offset + stride * index``, or None for an unseeded run."""
    return None if seed is None else seed + offset + stride * index


def worker_seed(seed: Optional[int], worker_index: int) -> Optional[int]:
    """The seed of rollout worker ``worker_index`` (its first env; the others follow it)."""
    return derive_seed(seed, index=worker_index, stride=WORKER_STRIDE)


def evaluation_seed(runner_seed: Optional[int]) -> Optional[int]:
    """The seed of a runner's evaluation envs (and of scripted opponents it evaluates against)."""
    return derive_seed(runner_seed, offset=EVALUATION_OFFSET)


def component_seed(seed: Optional[int], index: int) -> Optional[int]:
    """The seed of the ``index``-th component of one kind (a replay shard, a DD-PPO replica's rng)."""
    return derive_seed(seed, index=index, stride=COMPONENT_STRIDE)


def policy_offset(policy_id: str) -> int:
    """A stable 16-bit offset for a policy id (crc32: the same in every process, unlike ``hash``)."""
    return zlib.crc32(policy_id.encode()) & 0xFFFF


def policy_seed(seed: Optional[int], policy_id: str) -> Optional[int]:
    """The seed of policy ``policy_id`` derived from ``seed`` (a run's or a runner's)."""
    return derive_seed(seed, offset=policy_offset(policy_id))
