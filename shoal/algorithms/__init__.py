"""Algorithm registry: name -> (module, class), imported lazily so `shoal algos` stays fast."""

from __future__ import annotations

import importlib

from shoal.errors import ConfigError

# name: (module, algorithm class, config class, one-line description)
REGISTRY: dict[str, tuple[str, str, str, str]] = {
    "ppo": (
        "shoal.algorithms.ppo",
        "PPO",
        "PPOConfig",
        "Proximal Policy Optimization: GAE, clipped surrogate, synchronous sampling on N rollout actors.",
    ),
    "dqn": (
        "shoal.algorithms.dqn",
        "DQN",
        "DQNConfig",
        "DQN: double Q, dueling heads, n-step returns, uniform or prioritized replay, target network.",
    ),
    "apex": (
        "shoal.algorithms.apex",
        "ApeX",
        "ApeXConfig",
        "Ape-X DQN: many epsilon-greedy rollout actors, sharded prioritized replay actors, a background learner thread.",
    ),
    "apex_td3": (
        "shoal.algorithms.apex_td3",
        "ApeXTD3",
        "ApeXTD3Config",
        "Ape-X for continuous actions: per-actor Gaussian noise, sharded prioritized replay, a TD3 learner thread.",
    ),
    "impala": (
        "shoal.algorithms.impala",
        "IMPALA",
        "IMPALAConfig",
        "IMPALA: asynchronous sampling, V-trace, a learner thread (multi-device with tower stacks).",
    ),
    "appo": (
        "shoal.algorithms.appo",
        "APPO",
        "APPOConfig",
        "Asynchronous PPO: IMPALA's machinery with a clipped surrogate on V-trace advantages and a target network.",
    ),
    "ddppo": (
        "shoal.algorithms.ddppo",
        "DDPPO",
        "DDPPOConfig",
        "Decentralized distributed PPO: every worker samples and trains; gradients all-reduced with torch.distributed.",
    ),
    "sac": (
        "shoal.algorithms.sac",
        "SAC",
        "SACConfig",
        "Soft actor-critic for continuous actions: squashed Gaussian actor, twin critics, tuned entropy, replay.",
    ),
    "alpha_star": (
        "shoal.algorithms.alpha_star",
        "AlphaStar",
        "AlphaStarConfig",
        "AlphaStar league self-play on APPO: PettingZoo games, league builder, learner shards with batch replay.",
    ),
}


def _entry(name: str):
    key = name.lower()
    if key not in REGISTRY:
        import difflib

        close = difflib.get_close_matches(key, list(REGISTRY), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"Unknown algorithm '{name}'.{hint} Available: {', '.join(REGISTRY)}.")
    return REGISTRY[key]


def get_algorithm_class(name: str):
    mod, cls, _, _ = _entry(name)
    return getattr(importlib.import_module(mod), cls)


def get_config_class(name: str):
    mod, _, cfg, _ = _entry(name)
    return getattr(importlib.import_module(mod), cfg)


def describe() -> dict[str, str]:
    return {k: v[3] for k, v in REGISTRY.items()}
