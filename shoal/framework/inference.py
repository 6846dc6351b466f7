"""Acting in the driver with a running algorithm's current weights (``Algorithm.predict``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from shoal.errors import ConfigError
from shoal.rollout.policies import predict_actions

if TYPE_CHECKING:
    from shoal.framework.base import Algorithm


class DriverPredictor:
    """One inference policy of ``algo.policy_cls``, built on first use and given the algorithm's
    weights and global vars (e.g. DQN's epsilon at the env steps sampled so far) at each call."""

    def __init__(self, algo: "Algorithm") -> None:
        self.algo = algo
        self.policy: Any = None

    def __call__(
        self,
        obs,
        state: np.ndarray | None,
        episode_start: np.ndarray | None,
        deterministic: bool,
        action_mask: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        algo = self.algo
        if algo.policy_cls is None or algo.is_multi_agent:
            raise ConfigError(
                f"{type(algo).__name__}.predict serves single-agent policies; this run has none "
                "(a multi_agent section or a league)"
            )
        space = algo.env_info.observation_space
        if self.policy is None:
            self.policy = algo.policy_cls(space, algo.env_info.action_space, algo.config, algo.config.seed)
        self.policy.on_global_vars({"env_steps": int(algo.counters["env_steps_sampled"])})
        self.policy.set_weights(algo.get_weights())
        return predict_actions(
            self.policy,
            space,
            obs,
            state,
            episode_start,
            deterministic,
            algo.norm_stats,
            algo.config.normalize,
            action_mask,
        )
