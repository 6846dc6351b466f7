"""Inference without Ray: a trained policy from a checkpoint, for deployment code.

    policy = shoal.load_policy("runs/ppo_CartPole-v1_20261123-101500")   # a run dir: its best checkpoint
    action, state = policy.predict(obs)                                 # state: None unless recurrent

Only the policy network is built, in this process, from the checkpoint's config and weights:
no learner, no optimizer, no replay buffer, no thread and nothing of Ray. It acts as
:meth:`~shoal.framework.base.Algorithm.predict` does (both call
:func:`shoal.rollout.policies.predict_actions`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from shoal import checkpoint as ckpt
from shoal.errors import ConfigError
from shoal.rollout.policies import predict_actions


class Policy:
    """A trained single-agent policy: ``predict(obs, state=None, episode_start=None, deterministic=True)``."""

    def __init__(self, config, env_info, policy, norm_stats=None) -> None:
        self.config = config
        self.observation_space = env_info.observation_space
        self.action_space = env_info.action_space
        self.recurrent = config.model.is_recurrent()
        self._policy, self._norm_stats = policy, norm_stats

    def predict(
        self,
        obs,
        state: np.ndarray | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = True,
        action_mask: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """``(actions, state)`` for one observation or a batch; pass the state back with the next one.
        ``action_mask`` (one row per observation, as the env's ``info["action_mask"]``) keeps the
        actions among the legal ones; a Dict observation's ``"action_mask"`` entry is read without it."""
        return predict_actions(
            self._policy,
            self.observation_space,
            obs,
            state,
            episode_start,
            deterministic,
            self._norm_stats,
            self.config.normalize,
            action_mask,
        )

    def close(self) -> None:
        """Release the policy (leaving a ``with`` block calls it); it holds no process or thread."""
        self._policy = None

    def __enter__(self) -> "Policy":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def load_policy(
    path: str | Path | ckpt.OpenedCheckpoint,
    trust: bool = False,
    overrides: dict[str, Any] | None = None,
    policy: str | None = None,
    **config_kwargs: Any,
) -> Any:
    """The policy of a checkpoint, or of a run directory's best checkpoint (or of a checkpoint opened by
    :func:`shoal.checkpoint.open_checkpoint`, not read again here). ``overrides`` (a nested
    dict) and keyword arguments change the saved config as in ``Algorithm.from_checkpoint`` (e.g.
    ``env=my_callable`` for an env saved without an import path).

    A league run (alpha_star) holds several players: ``policy`` names one (``"main"``, an
    exploiter, a snapshot), ``"<player>@average"`` a learning player's average (a run
    with ``average_policy``: its parameter or behaviour average), or on an OpenSpiel game ``"league_nash"``, the Nash mixture of the
    meta-game over the frozen players; see :mod:`shoal.league.policies`.

    ``trust=True`` imports the code the checkpoint's config names (an env factory, a custom model)
    even when the checkpoint is not signed with your key, i.e. was not written by you on this
    machine; leave it False for a run directory from elsewhere (see :mod:`shoal.trust`)."""
    from shoal.framework.checkpointing import checkpoint_config_data, saved_norm_stats
    from shoal.framework.env_checks import describe_gym_env
    from shoal.trust import import_gate

    opened = ckpt.open_checkpoint(path, prefer="best")
    path = opened.path
    # a policy connects nowhere: the run's Ray cluster and trackers need no vouching here
    given = {**(overrides or {}), **config_kwargs}
    config_cls, meta, data, approved = checkpoint_config_data(opened, given, trust, destinations=False)
    algo_cls = config_cls.algorithm_cls
    if algo_cls is not None and algo_cls.is_league:
        with import_gate(approved):
            config = config_cls.from_dict(data)
        return _league_policy(opened, config, policy)
    if policy is not None:
        raise ConfigError(
            f"policy={policy!r} picks a player of a league run (alpha_star); checkpoint '{path}' "
            f"holds a {meta['algo']} run: leave policy out."
        )
    with import_gate(approved):
        config = config_cls.from_dict(data)
        if algo_cls is None or algo_cls.policy_cls is None or getattr(config, "multi_agent", None) is not None:
            raise ConfigError(
                f"Checkpoint '{path}' holds a {meta['algo']} run with several policies, and "
                "load_policy serves single-agent policies and league players: use shoal.load(path) "
                "and its evaluation for a multi_agent run."
            )
        info = describe_gym_env(config)
        acting = algo_cls.policy_cls(info.observation_space, info.action_space, config, config.seed)
    state = opened.state
    acting.set_weights(algo_cls.policy_weights(state))
    acting.on_global_vars({"env_steps": int(state["counters"]["env_steps_sampled"])})  # e.g. DQN's epsilon then
    norm_stats = saved_norm_stats(state) if config.normalize.enabled() else None
    return Policy(config, info, acting, norm_stats)


def _average_weights(state: dict, player: str, path: Any, config: Any, players: list[str]) -> Any:
    """A learning player's average from a league checkpoint's learner state (``average_policy``):
    its parameter average, or its behaviour average's network."""
    learner = state.get("learners", {}).get(player, {})
    if "behaviour_average" in learner:
        return learner["behaviour_average"]["net"]
    average = learner.get("average")
    if average is None:
        kind = getattr(config, "average_policy", None)
        why = (
            "this run kept none (average_policy: null)"
            if kind is None
            else f"only a player learning when the checkpoint was written keeps one, and {player!r} was not"
        )
        learning = ", ".join(f"{p}@average" for p in state.get("learners", {}))
        raise ConfigError(
            f"Checkpoint '{path}' has no average of {player!r}: {why}. Its players are "
            f"{', '.join(players)}{f'; its averages {learning}' if kind is not None and learning else ''}."
        )
    return average["module"]


def _league_policy(opened: ckpt.OpenedCheckpoint, config, policy: str | None):
    """A league player's policy, or its Nash mixture (``"league_nash"``), from checkpoint ``opened``."""
    import gymnasium as gym
    import torch

    from shoal.envs.multi_agent import make_multi_agent_env
    from shoal.league.policies import LEAGUE_NASH, LeaguePolicy, MixturePolicy, average_of
    from shoal.models import build_actor_critic

    state, path = opened.state, opened.path
    players = list(state["weights"])
    if policy is None:
        raise ConfigError(
            f"Checkpoint '{path}' holds a league of {len(players)} players: name one with policy= "
            f"({', '.join(players)}), or policy='{LEAGUE_NASH}' for the Nash mixture on an OpenSpiel game."
        )
    env = make_multi_agent_env(config.env, config.env_config)
    agent = env.possible_agents[0]
    obs_space, action_space = env.observation_space(agent), env.action_space(agent)
    env.close()
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(
            f"Checkpoint '{path}': a league's players pick one of n actions; its env acts in {action_space}."
        )

    def module(pid: str, weights: Any = None) -> torch.nn.Module:
        m = build_actor_critic(obs_space, action_space, config.model)
        m.load_state_dict(state["weights"][pid] if weights is None else weights)
        return m.eval()

    player = average_of(policy)
    if player is not None:
        weights = _average_weights(state, player, path, config, players)
        return LeaguePolicy(module(player, weights), policy, int(action_space.n), seed=config.seed)

    if policy == LEAGUE_NASH:
        if not (isinstance(config.env, str) and config.env.startswith("openspiel:")):
            raise ConfigError(
                f"policy='{LEAGUE_NASH}' is the Nash mixture computed on an OpenSpiel game; this "
                f"league played {config.env_name()!r}. Name a player instead ({', '.join(players)})."
            )
        from shoal.league.mixture import mixture_of_modules

        frozen = [p for p, spec in state["league"]["players"].items() if not spec["trainable"]] or ["main"]
        game_env = make_multi_agent_env(config.env, config.env_config).env
        return MixturePolicy(
            game_env.game,
            mixture_of_modules(game_env, {p: module(p) for p in frozen}),
            game_env.observation_kind,
            seed=config.seed,
        )
    if policy not in state["weights"]:
        raise ConfigError(
            f"Checkpoint '{path}' has no player {policy!r}; its players are {', '.join(players)}"
            f"{f', or {LEAGUE_NASH!r} for the Nash mixture' if str(config.env).startswith('openspiel:') else ''}."
        )
    return LeaguePolicy(module(policy), policy, int(action_space.n), seed=config.seed)
