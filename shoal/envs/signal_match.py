"""SignalMatch: a tiny PettingZoo Parallel env with any number of agents, for multi-agent checks.

Every step each agent sees two signals (each one of ``num_signals``, one-hot): its own, then
its neighbour's (the next agent's, in a ring), and, with ``show_index``, its position one-hot.
It scores +1 when its action names its neighbour's signal, 0 otherwise; the episode is cut
after ``episode_len`` steps (truncated, not terminated). Random play scores
``episode_len / num_signals`` per agent, a perfect agent ``episode_len``. It learns in seconds,
with one policy shared by every agent or one per agent::

    from shoal.algorithms.ppo import PPOConfig

    config = PPOConfig(env="shoal.envs.signal_match:parallel_env", env_config={"num_agents": 3},
                       multi_agent={"policies": {"shared": None}})
"""

from __future__ import annotations

import functools

import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv


class SignalMatch(ParallelEnv):
    metadata = {"name": "signal_match_v0", "render_modes": []}

    def __init__(
        self, num_agents: int = 3, num_signals: int = 3, episode_len: int = 10, show_index: bool = True
    ) -> None:
        if num_agents < 1 or num_signals < 2 or episode_len < 1:
            raise ValueError(
                f"SignalMatch needs num_agents >= 1, num_signals >= 2 and episode_len >= 1; got "
                f"{num_agents}, {num_signals}, {episode_len}"
            )
        self.n, self.k, self.episode_len, self.show_index = num_agents, num_signals, episode_len, show_index
        self.possible_agents = [f"agent_{i}" for i in range(num_agents)]
        self.agents: list[str] = []
        self._rng = np.random.default_rng()
        self._signals = np.zeros(num_agents, dtype=np.int64)
        self._t = 0

    @functools.cache  # noqa: B019  (PettingZoo's idiom: one space object per agent, the env lives for the run)
    def observation_space(self, agent: str) -> gym.Space:
        return gym.spaces.Box(0.0, 1.0, (2 * self.k + (self.n if self.show_index else 0),), np.float32)

    @functools.cache  # noqa: B019  (PettingZoo's idiom: one space object per agent, the env lives for the run)
    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(self.k)

    def _obs(self) -> dict[str, np.ndarray]:
        out = {}
        for i, a in enumerate(self.possible_agents):
            o = np.zeros(self.observation_space(a).shape, dtype=np.float32)
            o[self._signals[i]] = 1.0
            o[self.k + self._signals[(i + 1) % self.n]] = 1.0
            if self.show_index:
                o[2 * self.k + i] = 1.0
            out[a] = o
        return out

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._t = 0
        self._signals = self._rng.integers(self.k, size=self.n)
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions: dict):
        rewards = {
            a: float(int(actions[a]) == self._signals[(i + 1) % self.n]) for i, a in enumerate(self.possible_agents)
        }
        self._t += 1
        self._signals = self._rng.integers(self.k, size=self.n)
        done = self._t >= self.episode_len
        obs = self._obs()
        terms = {a: False for a in self.agents}
        truncs = {a: done for a in self.agents}
        infos = {a: {} for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, terms, truncs, infos


def parallel_env(**kwargs) -> SignalMatch:
    return SignalMatch(**kwargs)
