"""Observation spaces as the networks see them: widths, bytes and rows.

A leaf of the package (gymnasium, numpy and :mod:`shoal.errors` only), so models and envs both
use it without importing each other.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from shoal.errors import EnvError


def _entries(space: gym.Space) -> list[tuple[str, gym.Space]]:
    """A Dict's or Tuple's entries in order (a Dict's in its key order), named for errors."""
    if isinstance(space, gym.spaces.Dict):
        return list(space.spaces.items())
    return [(str(i), sub) for i, sub in enumerate(space.spaces)]


def _check_structured(space: gym.Space, where: str = "") -> None:
    """Dict and Tuple observations are concatenated into one float row: their entries must be
    vectors (float Box of any shape, Discrete, MultiBinary) or nested Dicts and Tuples of them."""
    for name, sub in _entries(space):
        path = f"{where}[{name!r}]" if where else f"[{name!r}]"
        if isinstance(sub, (gym.spaces.Dict, gym.spaces.Tuple)):
            _check_structured(sub, path)
        elif isinstance(sub, gym.spaces.Box) and sub.dtype == np.uint8 and len(sub.shape) >= 2:
            raise EnvError(
                f"Observation entry {path} is an image ({sub}); a Dict or Tuple observation is concatenated "
                "into one vector for an MLP here, so image entries are not supported in it yet. Give the image "
                "as the whole (Box) observation, or flatten the entry with a wrapper."
            )
        elif not isinstance(sub, (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiBinary)):
            raise EnvError(
                f"Observation entry {path} is {sub}; Dict and Tuple observations take Box, Discrete and "
                "MultiBinary entries (nested Dicts and Tuples of them)."
            )


def flat_obs_dim(space: gym.Space) -> int:
    """The width of one observation's row: a Box's elements, a Discrete's one-hot, a Dict's or
    Tuple's entries concatenated."""
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiBinary):
        return int(np.prod(space.shape))
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        _check_structured(space)
        return sum(flat_obs_dim(sub) for _, sub in _entries(space))
    raise EnvError(
        f"Observation space {space} is not supported; use Box, Discrete, or a Dict or Tuple of Box, "
        "Discrete and MultiBinary entries."
    )


def obs_nbytes(space: gym.Space | None) -> int:
    """Bytes of one observation's row: a Box's array; float32 rows for Dict and Tuple; 8 for anything else (a floor)."""
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape)) * space.dtype.itemsize
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        return 4 * flat_obs_dim(space)
    return 8


def is_single_obs(space: gym.Space, obs) -> bool:
    """Whether ``obs`` is one observation of ``space`` rather than a batch of them."""
    if isinstance(space, gym.spaces.Dict):
        key, sub = next(iter(space.spaces.items()))
        return is_single_obs(sub, obs[key])
    if isinstance(space, gym.spaces.Tuple):
        return is_single_obs(space.spaces[0], obs[0])
    return np.asarray(obs).shape == tuple(space.shape or ())


def stack_obs(observations: list):
    """Single observations as one batch: arrays stacked, in dicts and tuples too."""
    first = observations[0]
    if isinstance(first, dict):
        return {k: stack_obs([o[k] for o in observations]) for k in first}
    if isinstance(first, tuple):
        return tuple(stack_obs([o[i] for o in observations]) for i in range(len(first)))
    return np.stack([np.asarray(o) for o in observations])


def preprocess_obs(space: gym.Space, obs) -> np.ndarray:
    """A batch of observations as rows: Box ones flattened (uint8 ones, frames, stay uint8; the
    module scales them on its device; any other dtype becomes float32); Discrete ones one-hot;
    Dict and Tuple ones (a dict or tuple of batched arrays, as vector envs return them) their
    entries' rows concatenated in order, as float32."""
    if isinstance(space, gym.spaces.Discrete):
        return np.eye(space.n, dtype=np.float32)[np.asarray(obs, dtype=np.int64) - space.start]
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        keys = list(space.spaces) if isinstance(space, gym.spaces.Dict) else range(len(space.spaces))
        parts = [preprocess_obs(space[k], obs[k]) for k in keys]
        return np.concatenate([p.astype(np.float32, copy=False).reshape(len(p), -1) for p in parts], axis=1)
    if isinstance(space, gym.spaces.MultiBinary):
        obs = np.asarray(obs, dtype=np.float32)
        return obs.reshape(obs.shape[0], -1)
    obs = np.asarray(obs, dtype=np.uint8 if space.dtype == np.uint8 else np.float32)
    return obs.reshape(obs.shape[0], -1) if obs.ndim > 2 else obs
