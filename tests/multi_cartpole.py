"""Four independent CartPole-v1 agents as one PettingZoo ParallelEnv, and a league builder
that maps agent_i to policy p_i (multi-agent APPO through the AlphaStar algorithm)."""

from __future__ import annotations

import functools

import gymnasium as gym
from pettingzoo.utils.env import ParallelEnv

from shoal.league.builder import LeagueBuilder, policy_spec

NUM_AGENTS = 4


class MultiCartPole(ParallelEnv):
    """``NUM_AGENTS`` CartPoles stepping together; an agent leaves when its pole falls (or at 500 steps)."""

    metadata = {"name": "multi_cartpole_v0"}

    def __init__(self, num_agents: int = NUM_AGENTS) -> None:
        self.possible_agents = [f"agent_{i}" for i in range(num_agents)]
        self.agents = list(self.possible_agents)
        self.envs = {a: gym.make("CartPole-v1") for a in self.possible_agents}

    @functools.lru_cache(maxsize=None)  # noqa: B019  (PettingZoo's idiom)
    def observation_space(self, agent):
        return gym.make("CartPole-v1").observation_space

    @functools.lru_cache(maxsize=None)  # noqa: B019  (PettingZoo's idiom)
    def action_space(self, agent):
        return gym.make("CartPole-v1").action_space

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        obs = {}
        for i, a in enumerate(self.agents):
            obs[a], _ = self.envs[a].reset(seed=None if seed is None else seed + i)
        return obs, {a: {} for a in self.agents}

    def step(self, actions):
        obs, rew, term, trunc, infos = {}, {}, {}, {}, {}
        for a in self.agents:
            obs[a], rew[a], term[a], trunc[a], _ = self.envs[a].step(int(actions[a]))
            infos[a] = {}
        self.agents = [a for a in self.agents if not (term[a] or trunc[a])]
        return obs, rew, term, trunc, infos

    def close(self):
        for e in self.envs.values():
            e.close()


class _FixedMapping:
    def __init__(self, mapping: dict[str, str]) -> None:
        self.mapping = mapping

    def to_dict(self):
        return {"matches": [{"policies": dict(self.mapping), "match_type": "independent"}], "shuffle_seats": False}


class IndependentPolicies(LeagueBuilder):
    """agent_i always plays policy p_i; every policy learns; the league never changes."""

    def __init__(self, num_agents: int = NUM_AGENTS) -> None:
        super().__init__()
        self.num_agents = num_agents

    def _initial_players(self):
        return {f"p{i}": policy_spec("main", True) for i in range(self.num_agents)}

    def matchmaking(self):
        return _FixedMapping({f"agent_{i}": f"p{i}" for i in range(self.num_agents)})

    def record_results(self, match_results) -> None:  # not two-player games: no payoff table, just counts
        n = sum(1 for _ in match_results)
        self.match_type_counts["independent"] = self.match_type_counts.get("independent", 0) + n
