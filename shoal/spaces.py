"""Observation spaces as the networks see them: widths, bytes and rows.

A leaf of the package (gymnasium, numpy and :mod:`shoal.errors` only), so models and envs both
use it without importing each other.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from shoal.errors import EnvError


def flat_obs_dim(space: gym.Space) -> int:
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    raise EnvError(f"Observation space {space} is not supported yet; use Box or Discrete observations.")


def obs_nbytes(space: gym.Space | None) -> int:
    """Bytes of one observation: a Box's array; 8 for anything else (a floor)."""
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape)) * space.dtype.itemsize
    return 8


def preprocess_obs(space: gym.Space, obs: np.ndarray) -> np.ndarray:
    """Flatten Box observations to rows: uint8 ones (frames) stay uint8, the module scales them
    on its device; any other dtype becomes float32. Discrete ones are one-hot."""
    if isinstance(space, gym.spaces.Discrete):
        return np.eye(space.n, dtype=np.float32)[np.asarray(obs, dtype=np.int64) - space.start]
    obs = np.asarray(obs, dtype=np.uint8 if space.dtype == np.uint8 else np.float32)
    return obs.reshape(obs.shape[0], -1) if obs.ndim > 2 else obs
