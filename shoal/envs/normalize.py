"""Observation and reward normalization by running statistics (the ``normalize`` config section).

The statistics are Gymnasium's :class:`~gymnasium.wrappers.utils.RunningMeanStd` (mean,
variance and count, merged by the parallel-variance formula). They are kept here rather than
in Gymnasium's ``NormalizeObservation``/``NormalizeReward`` vector wrappers because the
wrappers own one set of statistics per env, while shoal needs three things they cannot give:
what each rollout actor saw since its last sync (to merge on the driver by counts), the raw
rewards beside the scaled ones (reported returns stay raw), and frozen use at evaluation.

- :class:`RunningStats` holds the statistics of observations (per feature of the policy's input
  rows) and of the discounted return. The driver keeps the merged ones; they travel to the
  actors with the weights, into checkpoints, and to evaluation, ``predict`` and ``load_policy``.
- :class:`Normalizer` is a rollout actor's side: the statistics last received plus what it has
  seen since (``take_new`` hands that to the driver and starts afresh), so nothing is counted twice.

Rewards are divided by the running std of ``G_t = gamma * G_{t-1} + r_t`` (reset at episode ends),
the scaling of PPO implementations since OpenAI baselines; observations become
``(x - mean) / sqrt(var + epsilon)``; both are clipped.
"""

from __future__ import annotations

import copy
from typing import Any, Optional

import gymnasium as gym
import numpy as np
from gymnasium.wrappers.utils import RunningMeanStd, update_mean_var_count_from_moments

from shoal.errors import ConfigError


def _empty(shape: tuple[int, ...]) -> RunningMeanStd:
    return RunningMeanStd(epsilon=0.0, shape=shape)  # count 0: the first merge takes the batch as it is


def _merge(into: RunningMeanStd, other: RunningMeanStd) -> None:
    if other.count > 0:
        into.update_from_moments(other.mean, other.var, other.count)


def _pooled(a: RunningMeanStd, b: RunningMeanStd) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of ``a``'s and ``b``'s samples together, leaving both as they are."""
    if b.count == 0 or a.count == 0:
        return (a.mean, a.var) if b.count == 0 else (b.mean, b.var)
    mean, var, _ = update_mean_var_count_from_moments(a.mean, a.var, a.count, b.mean, b.var, b.count)
    return mean, var


def _standardize(x: np.ndarray, mean: np.ndarray, var: np.ndarray, clip: float, epsilon: float) -> np.ndarray:
    return np.clip((x - mean) / np.sqrt(var + epsilon), -clip, clip).astype(np.float32)


def _scale(rewards: np.ndarray, var: np.ndarray, clip: float, epsilon: float) -> np.ndarray:
    return np.clip(rewards / np.sqrt(var + epsilon), -clip, clip).astype(np.float32)


class RunningStats:
    """Running mean/variance of observation features (``obs``) and of discounted returns (``ret``);
    either is None when that normalization is off."""

    def __init__(self, obs_shape: Optional[tuple[int, ...]], returns: bool) -> None:
        self.obs = _empty(obs_shape) if obs_shape is not None else None
        self.ret = _empty(()) if returns else None

    def merge(self, other: "RunningStats") -> None:
        """Take in ``other``'s samples (parallel-variance merge, weighted by counts)."""
        for mine, theirs in ((self.obs, other.obs), (self.ret, other.ret)):
            if mine is not None and theirs is not None:
                _merge(mine, theirs)

    def empty_like(self) -> "RunningStats":
        return RunningStats(None if self.obs is None else self.obs.mean.shape, self.ret is not None)

    def merged(self, other: "RunningStats") -> "RunningStats":
        out = copy.deepcopy(self)
        out.merge(other)
        return out

    def normalize_obs(self, rows: np.ndarray, clip: float, epsilon: float) -> np.ndarray:
        return rows if self.obs is None else _standardize(rows, self.obs.mean, self.obs.var, clip, epsilon)

    def scale_rewards(self, rewards: np.ndarray, clip: float, epsilon: float) -> np.ndarray:
        return rewards if self.ret is None else _scale(rewards, self.ret.var, clip, epsilon)

    def get_state(self) -> dict[str, Any]:
        return {
            k: None
            if s is None
            else {
                "mean": np.asarray(s.mean, dtype=np.float64).tolist(),
                "var": np.asarray(s.var, dtype=np.float64).tolist(),
                "count": float(s.count),
            }
            for k, s in (("obs", self.obs), ("ret", self.ret))
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "RunningStats":
        out = cls(None, False)
        for key in ("obs", "ret"):
            s = state.get(key)
            if s is not None:
                rms = _empty(np.shape(s["mean"]))
                rms.mean, rms.var, rms.count = (
                    np.asarray(s["mean"], np.float64),
                    np.asarray(s["var"], np.float64),
                    s["count"],
                )
                setattr(out, key, rms)
        return out

    @classmethod
    def for_config(cls, config, rows_shape: tuple[int, ...]) -> Optional["RunningStats"]:
        """Empty statistics for ``config.normalize`` and policy input rows of ``rows_shape``; None when off."""
        norm = config.normalize
        if not norm.enabled():
            return None
        return cls(rows_shape if norm.obs else None, norm.reward)


def check_normalize_applies(config, observation_space: gym.Space) -> None:
    """ConfigError for ``normalize.obs`` on observations it cannot mean anything for."""
    if not config.normalize.obs:
        return
    space = observation_space
    if not isinstance(space, gym.spaces.Box):
        raise ConfigError(
            f"normalize.obs needs Box observations of floats, but env {config.env_name()!r} observes "
            f"{space}: a discrete observation is one-hot encoded, and its mean and std mean nothing. "
            "Leave normalize.obs false."
        )
    if space.dtype == np.uint8:
        raise ConfigError(
            f"normalize.obs is not for uint8 pixel observations (env {config.env_name()!r}, shape "
            f"{space.shape}): the network already scales frames to [0, 1], and a per-pixel mean and std "
            "would erase the static background the policy reads positions against. Leave "
            "normalize.obs false (normalize.reward is fine)."
        )


class Normalizer:
    """A rollout actor's normalization: the driver's statistics (``synced``) plus its own new samples."""

    def __init__(self, config, stats: RunningStats, num_envs: int) -> None:
        self.cfg = config.normalize
        self.gamma = self.cfg.gamma if self.cfg.gamma is not None else config.gamma
        self.synced = stats
        self.new = stats.empty_like()
        self.returns = np.zeros(num_envs, dtype=np.float64)  # discounted return so far, per env

    def current(self) -> RunningStats:
        return self.synced.merged(self.new)

    def observations(self, rows: np.ndarray, update: bool = True) -> np.ndarray:
        """Normalized ``rows``. With ``update`` (training) they are counted first; without (evaluation)
        the driver's statistics as last received are used, frozen."""
        if self.new.obs is None:
            return rows
        if not update:
            return self.synced.normalize_obs(rows, self.cfg.clip_obs, self.cfg.epsilon)
        self.new.obs.update(np.asarray(rows, dtype=np.float64))
        mean, var = _pooled(self.synced.obs, self.new.obs)
        return _standardize(rows, mean, var, self.cfg.clip_obs, self.cfg.epsilon)

    def rewards(self, rewards: np.ndarray, done: np.ndarray, live: np.ndarray) -> np.ndarray:
        """What the learner gets for the raw ``rewards`` of one step of all envs (``live``: not a reset step)."""
        if self.new.ret is None:
            return rewards
        self.returns[live] = self.returns[live] * self.gamma + rewards[live]
        if live.any():
            self.new.ret.update(self.returns[live])
        self.returns[done] = 0.0  # a new episode starts its own return
        return _scale(rewards, _pooled(self.synced.ret, self.new.ret)[1], self.cfg.clip_reward, self.cfg.epsilon)

    def take_new(self) -> RunningStats:
        """The samples counted since the last call (for the driver to merge), counted into ``synced`` here too."""
        new, self.new = self.new, self.new.empty_like()
        self.synced.merge(new)
        return new

    def set_stats(self, state: dict[str, Any]) -> None:
        """The driver's merged statistics (which include everything ``take_new`` handed over)."""
        self.synced = RunningStats.from_state(state)
