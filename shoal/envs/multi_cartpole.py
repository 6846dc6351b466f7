"""MultiCartPole: ``num_agents`` independent CartPole-v1 poles as one PettingZoo Parallel env.

Each agent balances its own pole; an agent leaves when its pole falls (or at 500 steps) and the
episode ends when every pole is down. One agent step is one CartPole step, so a multi-agent run
on it can be set against a single-agent CartPole run on the same number of env steps (the
``multi_agent`` throughput benchmark does)::

    from shoal.algorithms.appo import APPOConfig

    config = APPOConfig(env="shoal.envs.multi_cartpole:parallel_env", env_config={"num_agents": 4},
                        multi_agent={"policies": {"shared": None}})
"""

from __future__ import annotations

import functools

import gymnasium as gym
from pettingzoo import ParallelEnv


class MultiCartPole(ParallelEnv):
    metadata = {"name": "multi_cartpole_v0", "render_modes": []}

    def __init__(self, num_agents: int = 4) -> None:
        if num_agents < 1:
            raise ValueError(f"MultiCartPole needs num_agents >= 1; got {num_agents}")
        self.possible_agents = [f"agent_{i}" for i in range(num_agents)]
        self.agents = list(self.possible_agents)
        self.envs = {a: gym.make("CartPole-v1") for a in self.possible_agents}

    @functools.lru_cache(maxsize=None)  # noqa: B019  (PettingZoo's idiom: one space object per agent)
    def observation_space(self, agent):
        return self.envs[agent].observation_space

    @functools.lru_cache(maxsize=None)  # noqa: B019
    def action_space(self, agent):
        return self.envs[agent].action_space

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        obs = {a: self.envs[a].reset(seed=None if seed is None else seed + i)[0] for i, a in enumerate(self.agents)}
        return obs, {a: {} for a in self.agents}

    def step(self, actions):
        obs, rew, term, trunc, infos = {}, {}, {}, {}, {}
        for a in self.agents:
            obs[a], rew[a], term[a], trunc[a], _ = self.envs[a].step(int(actions[a]))
            infos[a] = {}
        self.agents = [a for a in self.agents if not (term[a] or trunc[a])]
        return obs, rew, term, trunc, infos

    def close(self):
        for env in self.envs.values():
            env.close()


def parallel_env(num_agents: int = 4) -> MultiCartPole:
    return MultiCartPole(num_agents)
