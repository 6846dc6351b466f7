"""Env factories that fail in the ways a user's own factory can (for tests/test_bad_inputs.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


def raising_env(**kwargs):
    raise RuntimeError("the maze file maze.txt is missing")


def not_an_env(**kwargs):
    return 42


class OldGymApiEnv(gym.Env):
    """An env written for gym < 0.26: reset returns the observation alone, step returns four values."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        return np.zeros(4, np.float32)

    def step(self, action):
        return np.zeros(4, np.float32), 1.0, False, {}


class TextObsEnv(gym.Env):
    """An env whose observations are text, which no network of shoal's takes."""

    observation_space = gym.spaces.Text(8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        return "hello", {}

    def step(self, action):
        return "hello", 0.0, False, True, {}
