"""shoal: distributed reinforcement learning on Ray and PyTorch.

Public API::

    from shoal import PPOConfig, train, load
    algo = PPOConfig(env="CartPole-v1").build()
    result = algo.train()
"""

from __future__ import annotations

__version__ = "0.1.0"

from shoal.config import AlgorithmConfig  # noqa: E402
from shoal.errors import (  # noqa: E402
    CheckpointError,
    ConfigError,
    DivergenceError,
    EnvError,
    EnvFailureError,
    NonFiniteEnvError,
    ResourceError,
    ShoalError,
    UntrustedCodeError,
    WorkerError,
)

_LAZY = {
    "PPOConfig": ("shoal.algorithms.ppo", "PPOConfig"),
    "PPO": ("shoal.algorithms.ppo", "PPO"),
    "DQNConfig": ("shoal.algorithms.dqn", "DQNConfig"),
    "DQN": ("shoal.algorithms.dqn", "DQN"),
    "ApeXConfig": ("shoal.algorithms.apex", "ApeXConfig"),
    "ApeX": ("shoal.algorithms.apex", "ApeX"),
    "IMPALAConfig": ("shoal.algorithms.impala", "IMPALAConfig"),
    "IMPALA": ("shoal.algorithms.impala", "IMPALA"),
    "APPOConfig": ("shoal.algorithms.appo", "APPOConfig"),
    "APPO": ("shoal.algorithms.appo", "APPO"),
    "DDPPOConfig": ("shoal.algorithms.ddppo", "DDPPOConfig"),
    "DDPPO": ("shoal.algorithms.ddppo", "DDPPO"),
    "SACConfig": ("shoal.algorithms.sac", "SACConfig"),
    "SAC": ("shoal.algorithms.sac", "SAC"),
    "ApeXTD3Config": ("shoal.algorithms.apex_td3", "ApeXTD3Config"),
    "ApeXTD3": ("shoal.algorithms.apex_td3", "ApeXTD3"),
    "AlphaStarConfig": ("shoal.algorithms.alpha_star", "AlphaStarConfig"),
    "AlphaStar": ("shoal.algorithms.alpha_star", "AlphaStar"),
    "Algorithm": ("shoal.framework.base", "Algorithm"),
    "Callbacks": ("shoal.callbacks", "Callbacks"),
    "train": ("shoal.app.trainer", "train"),
    "Stop": ("shoal.app.trainer", "Stop"),
    "load": ("shoal.app.trainer", "load"),
    "load_policy": ("shoal.app.policy", "load_policy"),
    "export_policy": ("shoal.app.export", "export_policy"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'shoal' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names with the public ones loaded on first use (``PPOConfig``, ``train``...),
    so ``dir(shoal)`` and tab completion show them before they are imported."""
    return sorted({*globals(), *_LAZY})


__all__ = [
    "AlgorithmConfig",
    "ShoalError",
    "ConfigError",
    "EnvError",
    "CheckpointError",
    "ResourceError",
    "WorkerError",
    "DivergenceError",
    "EnvFailureError",
    "NonFiniteEnvError",
    "UntrustedCodeError",
    *_LAZY,
]
