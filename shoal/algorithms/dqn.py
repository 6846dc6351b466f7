"""DQN: double Q-learning, dueling heads, n-step returns, uniform or prioritized replay.

The config, the loss and the policy learner are Q-learning's (``q_learning.py``, shared with
Ape-X DQN); the replay, the n-step postprocessing and the synchronous loop around them are the
replay algorithms' (``replay_loop.py``, shared with SAC). What is DQN's own is below: one
training step samples a fragment per env, stores it, learns by credit and syncs the actors,
whose epsilon anneals over the sampled env steps.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from shoal.algorithms.q_learning import (  # noqa: F401 (unused ones: re-exported)
    Q_DISPLAY_METRICS,
    DQNConfig,
    DQNLoss,
    QLearnerModule,
    QModelConfig,
    QPolicyLearner,
    q_network_weights,
    q_targets,
)
from shoal.algorithms.replay_loop import (  # noqa: F401 (unused ones: re-exported)
    ReplayAlgorithm,
    check_replay_fits,
    learn_on_replay_batch,
    learn_on_replay_tensors,
    make_replay,
    n_step_postprocess,
    only_target,
    replay_kwargs,
)
from shoal.logging.metrics import Phase
from shoal.rollout.policies import EpsilonGreedyQPolicy
from shoal.schedule import PiecewiseSchedule


class DQN(ReplayAlgorithm):
    config_cls = DQNConfig
    config: DQNConfig
    policy_cls = EpsilonGreedyQPolicy
    result_keys = (*ReplayAlgorithm.result_keys, "replay_size", "num_target_updates", "epsilon")

    def setup(self) -> None:
        cfg: DQNConfig = self.config
        check_replay_fits(cfg, self.env_info.observation_space)
        self.policies = self.build_policies(QPolicyLearner)
        self.learner, self.target = self.policies.only.learner, only_target(self.policies)
        self.replay = make_replay(cfg, cfg.replay_capacity, cfg.seed)
        points = cfg.epsilon_schedule()
        assert points is not None, "DQN anneals one epsilon"
        self.epsilon = PiecewiseSchedule(points)  # what the rollout actors explore with, by env steps sampled
        postprocess = functools.partial(
            n_step_postprocess,
            n_step=cfg.n_step,
            gamma=cfg.gamma,
            priorities=cfg.worker_side_prioritization and cfg.prioritized_replay,
        )
        self.env_runners = self.make_env_runners(EpsilonGreedyQPolicy, postprocess, cfg.fragment_length())
        self.broadcast_weights()

    def display_metrics(self) -> list[tuple[str, str]]:
        return [*Q_DISPLAY_METRICS, ("epsilon", "epsilon")]

    @classmethod
    def policy_weights(cls, state: dict[str, Any]) -> dict[str, np.ndarray]:
        return q_network_weights(state)

    def training_step(self) -> dict[str, Any]:
        cfg: DQNConfig = self.config
        with self.timers.time(Phase.SAMPLE):
            results = self.env_runners.foreach("sample")
            steps = self.record_rollouts([m for _, m in results])
        with self.timers.time(Phase.STORE):
            self.store(results)
        stats: dict[str, float] = {}
        sampled = self.counters["env_steps_sampled"]
        if sampled >= cfg.learning_starts:
            with self.timers.time(Phase.LEARN):
                stats = self.learn_on_replay(steps * cfg.training_intensity / cfg.train_batch_size)
        with self.timers.time(Phase.SYNC):
            self.sync_actors()
        return {
            **{f"learner/{k}": v for k, v in stats.items()},
            "replay_size": self.replay.stats()["size"],
            "num_target_updates": self.target.num_updates,
            "epsilon": float(self.epsilon(sampled)),
        }
