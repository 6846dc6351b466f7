"""Small Gymnasium envs with MultiDiscrete and MultiBinary actions, for the action-space tests.

Each step shows a random target (one-hot per component, or the bits themselves) and pays one
point per component the action gets right; episodes are cut after ``episode_len`` steps.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class MultiSignal(gym.Env):
    """Two components of 3 choices each, numbered from ``start`` (the env checks the range)."""

    def __init__(self, episode_len: int = 10, start: int = 1) -> None:
        self.k, self.start, self.episode_len = 3, start, episode_len
        self.observation_space = gym.spaces.Box(0.0, 1.0, (2 * self.k,), np.float32)
        self.action_space = gym.spaces.MultiDiscrete([self.k, self.k], start=[start, start])
        self._rng = np.random.default_rng()

    def _obs(self) -> np.ndarray:
        obs = np.zeros(2 * self.k, np.float32)
        obs[self.target[0]] = obs[self.k + self.target[1]] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.t, self.target = 0, self._rng.integers(0, self.k, 2)
        return self._obs(), {}

    def step(self, action):
        action = np.asarray(action)
        assert self.action_space.contains(action.astype(np.int64)), action  # start applied by the policy
        reward = float(np.sum(action - self.start == self.target))
        self.t += 1
        self.target = self._rng.integers(0, self.k, 2)
        return self._obs(), reward, False, self.t >= self.episode_len, {}


class BitSignal(gym.Env):
    """Four bits to copy from the observation."""

    def __init__(self, episode_len: int = 10) -> None:
        self.n, self.episode_len = 4, episode_len
        self.observation_space = gym.spaces.Box(0.0, 1.0, (self.n,), np.float32)
        self.action_space = gym.spaces.MultiBinary(self.n)
        self._rng = np.random.default_rng()

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.t, self.bits = 0, self._rng.integers(0, 2, self.n)
        return self.bits.astype(np.float32), {}

    def step(self, action):
        action = np.asarray(action)
        assert self.action_space.contains(action.astype(np.int8)), action
        reward = float(np.sum(action == self.bits))
        self.t += 1
        self.bits = self._rng.integers(0, 2, self.n)
        return self.bits.astype(np.float32), reward, False, self.t >= self.episode_len, {}


class DictSignal(gym.Env):
    """A Dict observation: the signal to name (Discrete), a distractor vector (Box) and a flag
    pair (MultiBinary); Discrete(3) actions pay 1 for naming the signal."""

    def __init__(self, episode_len: int = 10) -> None:
        self.episode_len = episode_len
        self.observation_space = gym.spaces.Dict(
            {
                "signal": gym.spaces.Discrete(3),
                "noise": gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32),
                "flags": gym.spaces.MultiBinary(2),
            }
        )
        self.action_space = gym.spaces.Discrete(3)
        self._rng = np.random.default_rng()

    def _obs(self) -> dict:
        return {
            "signal": int(self.signal),
            "noise": self._rng.uniform(-1, 1, (2, 2)).astype(np.float32),
            "flags": self._rng.integers(0, 2, 2).astype(np.int8),
        }

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.t, self.signal = 0, self._rng.integers(0, 3)
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action) == self.signal)
        self.t += 1
        self.signal = self._rng.integers(0, 3)
        return self._obs(), reward, False, self.t >= self.episode_len, {}


class MaskedSignal(gym.Env):
    """Four actions, two of them legal each step: the target the one-hot observation shows and
    one other, drawn at random. The legal ones come in ``info["action_mask"]`` or, with
    ``in_obs``, as the ``"action_mask"`` entry of a Dict observation. The target pays 1, the
    other legal action 0, an illegal one -1 and is counted in ``MaskedSignal.illegal`` (shared by
    the instances of a process). A policy that ignores the mask picks an illegal action half the
    time at the start; one that honours it, never."""

    illegal = 0

    def __init__(self, episode_len: int = 16, in_obs: bool = False) -> None:
        self.episode_len, self.in_obs = episode_len, in_obs
        signal = gym.spaces.Box(0.0, 1.0, (4,), np.float32)
        self.observation_space = (
            gym.spaces.Dict({"signal": signal, "action_mask": gym.spaces.MultiBinary(4)}) if in_obs else signal
        )
        self.action_space = gym.spaces.Discrete(4)
        self._rng = np.random.default_rng()

    def _draw(self):
        self.target = int(self._rng.integers(4))
        self.mask = np.zeros(4, np.int8)
        self.mask[self.target] = 1
        self.mask[(self.target + 1 + self._rng.integers(3)) % 4] = 1
        signal = np.eye(4, dtype=np.float32)[self.target]
        if self.in_obs:
            return {"signal": signal, "action_mask": self.mask.copy()}, {}
        return signal, {"action_mask": self.mask.copy()}

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.t = 0
        return self._draw()

    def step(self, action):
        action = int(action)
        if not self.mask[action]:
            type(self).illegal += 1
            reward = -1.0
        else:
            reward = float(action == self.target)
        self.t += 1
        obs, info = self._draw()
        return obs, reward, False, self.t >= self.episode_len, info


class PixelPair(gym.Env):
    """A Dict observation of an image and a vector that only together tell the right action: the
    ``"frame"`` (uint8, 8x8x1) lights one pixel in its left or right half, the ``"flip"`` entry
    (one float, 0 or 1) is a second bit; the right action of the four is ``2 * side + flip``.
    One point per right answer, episodes of 16 steps: 4 by guessing, 8 reading one entry alone,
    16 reading both."""

    def __init__(self, episode_len: int = 16) -> None:
        self.episode_len = episode_len
        self.observation_space = gym.spaces.Dict(
            {"frame": gym.spaces.Box(0, 255, (8, 8, 1), np.uint8), "flip": gym.spaces.Box(0.0, 1.0, (1,), np.float32)}
        )
        self.action_space = gym.spaces.Discrete(4)
        self._rng = np.random.default_rng()

    def _obs(self):
        side, flip = int(self._rng.integers(2)), int(self._rng.integers(2))
        frame = np.zeros((8, 8, 1), np.uint8)
        frame[self._rng.integers(8), 4 * side + self._rng.integers(4), 0] = 255
        self.answer = 2 * side + flip
        return {"frame": frame, "flip": np.array([flip], np.float32)}

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action) == self.answer)
        self.t += 1
        return self._obs(), reward, False, self.t >= self.episode_len, {}


class MixedSignal(gym.Env):
    """Observations that mix every kind of entry the default models take: a small image
    ``"patch"`` (uint8 8x8x1, smaller than the Nature CNN fits), an Atari-size one ``"screen"``
    (uint8 1x84x84), a float ``"vector"`` and the ``"signal"`` to name (Discrete(3)); a Dict, or
    with ``tuple_obs`` a Tuple of the same entries in that order, or with ``images=False`` the
    vector and the signal only (SAC takes vector entries only). The patch and the screen light a
    pixel where the signal says. Discrete(3) actions pay 1 for naming the signal; with
    ``box_actions`` one action in [-1, 1] pays minus its distance to ``signal - 1``."""

    def __init__(
        self, episode_len: int = 8, tuple_obs: bool = False, images: bool = True, box_actions: bool = False
    ) -> None:
        self.episode_len, self.tuple_obs, self.images, self.box_actions = episode_len, tuple_obs, images, box_actions
        entries = {
            "patch": gym.spaces.Box(0, 255, (8, 8, 1), np.uint8),
            "screen": gym.spaces.Box(0, 255, (1, 84, 84), np.uint8),
            "vector": gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
            "signal": gym.spaces.Discrete(3),
        }
        if not images:
            del entries["patch"], entries["screen"]
        self.keys = list(entries)
        spaces = gym.spaces
        self.observation_space = spaces.Tuple(tuple(entries.values())) if tuple_obs else spaces.Dict(entries)
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32) if box_actions else spaces.Discrete(3)
        self._rng = np.random.default_rng()

    def _obs(self):
        self.signal = int(self._rng.integers(3))
        obs = {"vector": self._rng.uniform(-1, 1, 3).astype(np.float32), "signal": self.signal}
        if self.images:
            obs["patch"] = np.zeros((8, 8, 1), np.uint8)
            obs["patch"][self.signal, self.signal, 0] = 255
            obs["screen"] = np.zeros((1, 84, 84), np.uint8)
            obs["screen"][0, 28 * self.signal : 28 * self.signal + 28, :] = 255
        return tuple(obs[k] for k in self.keys) if self.tuple_obs else {k: obs[k] for k in self.keys}

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        if self.box_actions:
            reward = -abs(float(np.asarray(action).reshape(-1)[0]) - (self.signal - 1))
        else:
            reward = float(int(action) == self.signal)
        self.t += 1
        return self._obs(), reward, False, self.t >= self.episode_len, {}
