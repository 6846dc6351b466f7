"""The Ape-X pipeline's keys and its rollout actors (the pipeline itself is ``apex_pipeline.py``).

Rollout actor i of N (ids 1..N) explores with the fixed epsilon
``exploration_base ** (1 + exploration_alpha * (i - 1) / (N - 1))`` (0.4 and 7 by default) and
writes each sampled batch, n-step transitions with their initial priorities when it computes
them, straight into a random replay shard. :func:`reporting_envs` picks the envs whose
episodes the headline metrics count.
"""

from __future__ import annotations

import math
from typing import Union

import numpy as np
from pydantic import Field

from shoal.batch import Col
from shoal.config import ResourcesConfig, Section
from shoal.rollout import EnvRunner
from shoal.rollout.policies import apex_epsilon


# ---- config -----------------------------------------------------------------------------
class ApeXResourcesConfig(ResourcesConfig):
    num_replay_shards: int = Field(
        4, ge=1, description="Replay shard actors; the replay capacity is split evenly over them."
    )
    replay_shard_cpus: float = Field(
        1.0,
        ge=0,
        description="CPUs each replay shard reserves, 1 as in the reference Ape-X "
        "(0: shards share the driver's; the small-machine preset's choice).",
    )
    replay_shards_on_driver_node: bool = Field(
        True, description="Place replay shards on the driver's node (beside the learner)."
    )


class ApeXKeys(Section):
    """The Ape-X pipeline, whatever learns at its end (Ape-X DQN, Ape-X TD3): per-actor exploration,
    replay shards, n-step transitions, the training intensity and the request pipeline."""

    resources: ApeXResourcesConfig = Field(
        default_factory=ApeXResourcesConfig, description="Rollout actors plus the replay shards."
    )
    n_step: int = Field(3, ge=1, description="Rewards summed per transition before bootstrapping.")
    replay_capacity: int = Field(2_000_000, ge=1, description="Total over all replay shards.")
    learning_starts: int = Field(50_000, ge=0, description="Sampled env steps before the learner starts.")
    train_batch_size: int = Field(512, ge=1, description="Transitions per replayed batch (one SGD step).")
    rollout_fragment_length: Union[int, str] = Field(50, description="Steps per env per sample call.")
    training_intensity: float = Field(1.0, gt=0, description="Replayed env steps per sampled env step.")
    prioritized_replay: bool = Field(True, description="Sample by TD-error priority; false: uniformly.")
    min_time_s_per_iteration: float = Field(
        1.0, ge=0, description="Asynchronous: one result (and row) per second, not per step."
    )
    min_env_steps_per_iteration: int = Field(
        0,
        ge=0,
        description="An iteration repeats training steps until it has "
        "sampled this many env steps (Ape-X reports by time instead).",
    )
    max_weight_sync_delay: int = Field(
        400, ge=1, description="Steps an actor samples before its weights are refreshed."
    )
    max_requests_in_flight_per_worker: int = Field(4, ge=1, description="Sample requests kept open per rollout actor.")
    max_replay_requests_in_flight_per_shard: int = Field(
        16, ge=1, description="Replay requests kept open per replay shard."
    )
    learner_queue_size: int = Field(
        64,
        ge=1,
        description="Replayed batches waiting for the learner thread; with the "
        "requests in flight it bounds how far replay runs ahead of learning.",
    )
    final_prioritized_replay_beta: float = Field(0.4, ge=0, le=1, description="Ape-X keeps beta fixed by default.")
    exploration_base: float = Field(0.4, gt=0, lt=1, description="Epsilon base of the per-actor schedule.")
    exploration_alpha: float = Field(7.0, ge=0, description="Epsilon exponent spread of the per-actor schedule.")

    def epsilon_schedule(self) -> None:  # Ape-X: fixed per-actor exploration instead of an annealed one
        return None

    def fragment_length(self) -> int:
        return self.rollout_fragment_length if isinstance(self.rollout_fragment_length, int) else 50


# ---- rollout actor ----------------------------------------------------------------------
def actor_epsilons(num_workers: int, num_envs: int, base: float, alpha: float) -> dict[int, np.ndarray]:
    """The epsilon of every env of every rollout actor, by actor id.

    Rollout actor i of N (ids 1..N) explores with ``base ** (1 + alpha * (i - 1) / (N - 1))`` on
    all its envs; with ``num_workers=0`` the driver's runner (id 0) spreads the schedule over the
    envs of its vector instead, env j of ``num_envs`` getting the j-th epsilon.
    """
    if num_workers > 0:
        return {i: np.full(num_envs, apex_epsilon(i - 1, num_workers, base, alpha)) for i in range(1, num_workers + 1)}
    return {0: np.array([apex_epsilon(j, num_envs, base, alpha) for j in range(num_envs)])}


def reporting_envs(epsilons: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Per actor id, a mask of the envs whose episodes the headline metrics count: the third of
    all envs with the lowest epsilon (at least one), with the envs tied with the last of them.

    Envs with epsilon 0.4 play far worse than the greedy policy, so counting their episodes
    would bias ``episode_return_mean`` (and the ``best`` checkpoint it picks) low. With several
    actors, whose envs share their actor's epsilon, the ties make this the third of actors with
    the lowest epsilon (rounded up).
    """
    ranked = np.sort(np.concatenate(list(epsilons.values())))
    cutoff = ranked[math.ceil(len(ranked) / 3) - 1]
    return {i: eps <= cutoff for i, eps in epsilons.items()}


class ApeXRunner(EnvRunner):
    """An EnvRunner that writes its own batches (with initial priorities) into a random replay shard."""

    def __init__(self, config: ApeXKeys, worker_index: int, *args, **kwargs) -> None:
        super().__init__(config, worker_index, *args, **kwargs)
        n = config.resources.num_workers
        eps = actor_epsilons(n, self.num_envs, config.exploration_base, config.exploration_alpha)[worker_index]
        self.policy.epsilon = float(eps[0]) if n > 0 else eps  # one per env when sampling in the driver
        self.shards: list = []
        self.rng = np.random.default_rng(self.seed)

    def set_shards(self, shards: list) -> None:
        self.shards = list(shards)

    def sample_into_replay(self):
        batch, metrics = self.sample()
        priorities = batch.data.pop(Col.PRIORITIES, None)  # None without worker-side prioritization
        if self.shards:
            self.shards[int(self.rng.integers(len(self.shards)))].add(batch, priorities)
        return metrics
