"""Inference without Ray: a trained policy from a checkpoint, for deployment code.

    policy = shoal.load_policy("runs/ppo_CartPole-v1_20261123-101500")   # a run dir: its best checkpoint
    action, state = policy.predict(obs)                                 # state: None unless recurrent

The algorithm is rebuilt from the checkpoint in this process with no rollout actors and no
learner work (nothing of Ray starts), and its single-agent policy answers
:meth:`~shoal.algorithms.base.Algorithm.predict`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from shoal import checkpoint as ckpt


class Policy:
    """A trained single-agent policy: ``predict(obs, state=None, episode_start=None, deterministic=True)``."""

    def __init__(self, algo) -> None:
        self._algo = algo
        self.config = algo.config
        self.observation_space = algo.env_info.observation_space
        self.action_space = algo.env_info.action_space
        self.recurrent = algo.config.model.is_recurrent()

    def predict(self, obs, state: np.ndarray | None = None, episode_start: np.ndarray | None = None,
                deterministic: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
        """``(actions, state)`` for one observation or a batch; pass the state back with the next one."""
        return self._algo.predict(obs, state, episode_start=episode_start, deterministic=deterministic)

    def close(self) -> None:
        """Release the algorithm behind the policy (leaving a ``with`` block calls it)."""
        self._algo.stop()

    def __enter__(self) -> "Policy":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def load_policy(path: str | Path, trust: bool = False, **kwargs: Any) -> Policy:
    """The policy of a checkpoint, or of a run directory's best checkpoint. Keyword arguments go to
    ``Algorithm.from_checkpoint`` (e.g. ``env=my_callable`` for an env saved without an import path).

    ``trust=True`` imports the code the checkpoint's config names (an env factory, a custom model)
    even when the checkpoint is not signed with your key, i.e. was not written by you on this
    machine; leave it False for a run directory from elsewhere (see :mod:`shoal.trust`)."""
    from shoal.algorithms.base import Algorithm

    return Policy(Algorithm.from_checkpoint(ckpt.resolve_checkpoint(path, prefer="best"), trust=trust, **kwargs))
