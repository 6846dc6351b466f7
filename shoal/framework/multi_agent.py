"""The ``multi_agent`` section of PPO, IMPALA and APPO: a PettingZoo env and its agents.

``PPOConfig(env="pettingzoo.classic:rps_v2", multi_agent={...}).build()`` is the same PPO class
as a single-agent run: the algorithm holds a :class:`~shoal.framework.policies.PolicySet` of
several policies instead of one, and its rollout actors are the multi-agent runner. The data
flow:

- Rollout actors are :class:`~shoal.rollout.multi_agent.MultiAgentEnvRunner`: ``num_envs_per_worker``
  copies of a PettingZoo env (Parallel or AEC, any number of agents), every agent played by the
  policy ``policy_mapping`` gives it when its episode starts, one batched forward per policy
  per tick, illegal actions masked. Each ``sample()`` returns, per learning policy, sequences
  of ``rollout_fragment_length`` decisions (one agent's decisions in order, reset rows marked
  by ``VALID``) with the action masks they were sampled under.
- Each learning policy learns on its own rows with the algorithm's loss under the stored
  masks, with its own config (the algorithm's, with the policy's ``config`` and ``model``
  overrides). PPO samples and learns in turns and computes GAE learner-side from the current
  network's values over each sequence; IMPALA and APPO keep their asynchronous pipeline: one
  learner thread trains every policy, each on train batches of its own sequences.
- Policies outside ``policies_to_train`` keep their initial weights for the whole run.
- Results add ``policy_return_mean/<id>`` (last 100 episodes of each policy's agents) and the
  learners' statistics as ``learner/<id>/<stat>``.

This module holds what the section needs beside the policies: the env's agents and spaces,
the rollout actors' arguments, and greedy evaluation episodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import gymnasium as gym

from shoal.envs import EnvInfo
from shoal.envs.multi_agent import make_multi_agent_env
from shoal.errors import ConfigError
from shoal.imports import import_path
from shoal.rollout.multi_agent import MultiAgentEnvRunner, PolicyReturnWindows


def sequence_length(config) -> int:
    """Decisions per sequence the runner cuts: a recurrent model's training sequence
    (``state_sequence_length``: max_seq_len for PPO), otherwise rollout_fragment_length."""
    return config.state_sequence_length() if config.model.is_recurrent() else config.fragment_length()


@dataclass
class Agents:
    """The agents of a ``multi_agent`` run's env, their spaces, and the policy each one plays."""

    names: list[str]
    spaces: dict[str, tuple[gym.Space, gym.Space]]
    mapping: Any  # the section's policy_mapping: a dict agent -> policy id, an import path, or None

    @classmethod
    def describe(cls, config) -> "Agents":
        """From one throwaway copy of the env; a dict mapping must name exactly its agents."""
        env = make_multi_agent_env(config.env, config.env_config)  # fails early on a bad env
        try:
            names = list(env.possible_agents)
            spaces = {a: (env.observation_space(a), env.action_space(a)) for a in names}
        finally:
            env.close()
        mapping = config.multi_agent.policy_mapping
        if isinstance(mapping, dict):
            unknown, missing = sorted(set(mapping) - set(names)), sorted(set(names) - set(mapping))
            if unknown or missing:
                raise ConfigError(
                    f"multi_agent.policy_mapping must map exactly the env's agents {names}; "
                    + (f"unknown: {unknown}" if unknown else f"missing: {missing}")
                )
        return cls(names, spaces, mapping)

    def env_info(self) -> EnvInfo:
        """The first agent's spaces (what ``algo.env_info`` reports)."""
        obs_space, action_space = self.spaces[self.names[0]]
        return EnvInfo(obs_space, action_space, None, None)

    def agent_for(self, pid: str) -> str:
        """The agent whose spaces policy ``pid`` is built for: the first one a dict mapping gives it."""
        if isinstance(self.mapping, dict):
            for agent in self.names:
                if self.mapping.get(agent) == pid:
                    return agent
        return self.names[0]

    def runner_args(self, config, index: int, weights: Callable[[str], Any], trained: list[str]):
        """``(args, kwargs)`` of rollout actor ``index``: every policy's spec with ``weights(pid)``."""
        specs = {
            pid: {
                "weights": weights(pid),
                "model": dict(spec.model) if spec else {},
                "agent": self.agent_for(pid),
                "trainable": pid in trained,
            }
            for pid, spec in config.multi_agent.policies.items()
        }
        kwargs: dict[str, Any] = {
            "policies_to_train": list(trained),
            "rollout_fragment_length": sequence_length(config),
            "ticks_per_sample": config.fragment_length(),
        }
        if isinstance(self.mapping, dict):
            kwargs["matchmaking"] = {"matches": [{"policies": dict(self.mapping)}], "shuffle_seats": False}
        elif isinstance(self.mapping, str):
            return (config, index, specs, import_path(self.mapping)), kwargs
        return (config, index, specs), kwargs


def evaluation_episodes(args: tuple, kwargs: dict, n: int, explore: bool = False):
    """At least ``n`` episodes on a separate runner in the driver (built from a rollout actor's
    ``args, kwargs``), greedy unless ``explore``: their returns (summed over agents) and lengths
    in finishing order, and the per-policy returns."""
    runner = MultiAgentEnvRunner(*args, **{**kwargs, "policies_to_train": [], "num_envs": min(n, 8)})
    returns: list[float] = []
    lengths: list[int] = []
    windows = PolicyReturnWindows(n)
    try:
        while len(returns) < n:
            _, m = runner.sample(explore=explore)
            returns.extend(m.episode_returns)
            lengths.extend(m.episode_lengths)
            windows.add(m)
    finally:
        runner.stop()
    return returns, lengths, windows
