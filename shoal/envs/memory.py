"""RememberCue: the smallest task that needs memory, for checking a recurrent pipeline in seconds.

Each episode shows a cue (left or right) on its first step, then ``delay`` blank steps, then a
query. The action taken at the query scores +1 if it names the cue and -1 otherwise; every
other step scores 0. A feed-forward policy sees the same blank query whatever the cue was and
can do no better than 0 on average; a recurrent one (``model.use_lstm``) that carries the cue
in its state scores 1::

    from shoal.algorithms.ppo import PPOConfig

    config = PPOConfig(env="shoal.envs.memory:RememberCue", env_config={"delay": 4}, model={"use_lstm": True})

Observation: ``[cue is left, cue is right, this is the query]`` (float32); actions: 0 left, 1 right.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class RememberCue(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, delay: int = 4) -> None:
        if delay < 0:
            raise ValueError(f"RememberCue needs delay >= 0, got {delay}")
        self.delay = delay
        self.observation_space = gym.spaces.Box(0.0, 1.0, (3,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._cue = 0
        self._t = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(3, dtype=np.float32)
        if self._t == 0:
            obs[self._cue] = 1.0
        if self._t == self.delay + 1:
            obs[2] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._cue = int(self.np_random.integers(2))
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        if self._t == self.delay + 1:  # the query: score the answer, end the episode
            return self._obs(), (1.0 if int(action) == self._cue else -1.0), True, False, {}
        self._t += 1
        return self._obs(), 0.0, False, False, {}
