"""Ape-X DQN: epsilon-greedy rollout actors, sharded prioritized replay, a background learner.

The pipeline (rollout actors writing into replay shards, the training intensity, the request
pipeline, the learner thread) is ``apex_pipeline.py``'s and its keys and rollout actors are
``apex_actors.py``'s, both shared with Ape-X TD3; the config, the loss and the policy learner
are Q-learning's (``q_learning.py``), shared with DQN. What is Ape-X DQN's own is below: DQN's
keys joined to the pipeline's with DQN's epsilon schedule refused, epsilon-greedy rollout
actors that compute their transitions' initial priorities from
their own Q-values, and the Q-network learner.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field

from shoal.algorithms.apex_actors import ApeXKeys
from shoal.algorithms.apex_pipeline import ApeXPipeline
from shoal.algorithms.q_learning import Q_DISPLAY_METRICS, DQNConfig, QPolicyLearner, q_network_weights
from shoal.rollout.policies import EpsilonGreedyQPolicy

# ---- config -----------------------------------------------------------------------------
_FIXED_EPSILONS = (
    "Ape-X gives rollout actor i of N the fixed epsilon exploration_base ** (1 + exploration_alpha * i "
    "/ (N - 1)) instead of annealing one; set exploration_base and exploration_alpha"
)


class ApeXConfig(ApeXKeys, DQNConfig):
    """DQN's keys plus per-actor fixed epsilons, replay shards and the request pipeline; DQN's
    epsilon schedule is refused (``unused_keys``)."""

    algo = "apex"
    unused_keys = {
        "exploration_initial_eps": _FIXED_EPSILONS,
        "exploration_final_eps": _FIXED_EPSILONS,
        "exploration_timesteps": _FIXED_EPSILONS,
        "normalize": "Ape-X's actors write to the replay shards and sync with the driver only for "
        "weights, so running statistics could not be merged across them",
    }

    target_network_update_freq: int = Field(
        500_000, ge=1, description="Trained env steps between target-network updates."
    )
    worker_side_prioritization: bool = Field(
        True, description="Rollout actors compute initial priorities from their own Q-values."
    )

    @classmethod
    def small_machine_preset(cls) -> dict[str, Any]:
        """What ``shoal train apex`` uses when no resources are given: sized for a 2-core machine."""
        return {
            "resources": {
                "num_workers": 2,
                "num_envs_per_worker": 16,
                "num_cpus_per_worker": 0.5,
                "num_replay_shards": 2,
                "replay_shard_cpus": 0.0,
            },
            "rollout_fragment_length": 64,
            "replay_capacity": 100_000,
            "learning_starts": 5_000,
            "train_batch_size": 256,
            "target_network_update_freq": 25_600,
            "training_intensity": 4.0,
            "lr": 1e-3,
            "max_requests_in_flight_per_worker": 1,
            "max_replay_requests_in_flight_per_shard": 32,
        }


# ---- algorithm --------------------------------------------------------------------------
class ApeX(ApeXPipeline):
    """The Ape-X pipeline with epsilon-greedy rollout actors and DQN's :class:`QPolicyLearner`."""

    config_cls = ApeXConfig
    config: ApeXConfig
    policy_cls = EpsilonGreedyQPolicy  # what the rollout actors act with (``epsilon`` set per actor)
    learner_cls = QPolicyLearner  # what learns from the replayed batches

    def worker_priorities(self) -> bool:
        """Whether rollout actors compute their transitions' initial priorities (from their Q-values)."""
        return self.config.worker_side_prioritization and self.config.prioritized_replay

    def display_metrics(self) -> list[tuple[str, str]]:
        return Q_DISPLAY_METRICS

    @classmethod
    def policy_weights(cls, state: dict[str, Any]) -> dict[str, np.ndarray]:
        return q_network_weights(state)
