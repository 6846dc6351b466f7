"""AlphaStar's config: APPO's key groups but the learner thread's, the league, and the learner
shards' resources. The algorithm is ``alpha_star.py``'s; every check that needs only the config
(the league builder's learner slots, the learner groups, whole V-trace minibatches) runs here,
when the config is built.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import Field, model_validator

from shoal.algorithms.alpha_star_average import check_average_opponent
from shoal.algorithms.alpha_star_group import LeagueGroupResources, check_learner_groups
from shoal.algorithms.loss_keys import (
    ClipTargetKeys,
    KLPenaltyKeys,
    PolicyAverageKeys,
    VTraceKeys,
    check_kl_against_target,
    check_policy_average,
)
from shoal.config import AlgorithmConfig, EnvSpec, EvaluationConfig
from shoal.errors import ConfigError
from shoal.framework.config_groups import AsyncSamplingKeys, check_whole_sequences
from shoal.league import make_league_builder


class AlphaStarResourcesConfig(LeagueGroupResources):
    num_learner_shards: Optional[int] = Field(
        None, ge=1, description="Learner shards; None: one per GPU, or one per policy without GPUs."
    )
    num_cpus_per_learner: float = Field(1.0, ge=0, description="CPUs each policy learner actor reserves (remote runs).")
    remote_learners: Optional[bool] = Field(
        None,
        description="Learner shards as Ray actors. None: when num_workers > 0. False with remote rollout actors: "
        "the learners and their replays stay in the driver and the actors send their batches back to it (on a "
        "small machine, one rollout process beside a learning driver).",
    )

    def learners_remote(self) -> bool:
        return self.num_workers > 0 if self.remote_learners is None else self.remote_learners


class AlphaStarEvaluationConfig(EvaluationConfig):
    unused_keys = {"evaluation_num_workers": "a league is evaluated in the driver, main against the random player"}


_ONE_DEVICE = "each policy learner actor is one Learner on one device; IMPALA's multi-device learner is not used"
_NO_LEARNER_QUEUE = (
    "policy learners pull their batches from their shard's replay (replay_buffer_capacity, "
    "replay_ratio); IMPALA's learner queue and minibatch ring are not used"
)


class AlphaStarConfig(VTraceKeys, AsyncSamplingKeys, ClipTargetKeys, KLPenaltyKeys, PolicyAverageKeys, AlgorithmConfig):
    """APPO's key groups but the learner thread's, plus the league; APPO's learner-thread
    keys are refused with the reason (``unused_keys``)."""

    algo = "alpha_star"
    mutable_keys = frozenset()  # the learners live in other processes: nothing changes mid-run
    lstm_sequences = "fragments"
    unused_keys = {
        "num_learner_devices": _ONE_DEVICE,
        "fake_devices": _ONE_DEVICE,
        "num_multi_gpu_tower_stacks": _ONE_DEVICE,
        "num_data_load_threads": _ONE_DEVICE,
        "learner_queue_size": _NO_LEARNER_QUEUE,
        "learner_queue_timeout": _NO_LEARNER_QUEUE,
        "minibatch_buffer_size": _NO_LEARNER_QUEUE,
        "env_preprocessing": "a league plays PettingZoo envs; Atari frame preprocessing applies to ALE envs",
        "normalize": "a league's players share no single observation stream to normalize by",
    }

    env: EnvSpec = Field(
        "pettingzoo.classic:tictactoe_v3", description="A PettingZoo env: import path, module or callable."
    )
    resources: AlphaStarResourcesConfig = Field(
        default_factory=AlphaStarResourcesConfig, description="Rollout actors plus the learner shards."
    )
    evaluation: AlphaStarEvaluationConfig = Field(
        default_factory=AlphaStarEvaluationConfig, description="Main against a random player during training."
    )
    league: Union[str, dict[str, Any], None] = Field(
        "alpha_star",
        description="League builder: a name (alpha_star, no_league), an import path, or {type: ..., **kwargs}.",
    )
    replay_ratio: float = Field(0.0, ge=0, le=1, description="Fraction of learned batches that are replayed ones.")
    replay_buffer_capacity: int = Field(
        10, ge=1, description="Batches each policy's replay keeps (and new ones that may wait)."
    )
    max_num_policies_to_train: int = Field(
        4, ge=1, description="Learner slots over all shards: the most learning policies at once."
    )
    learner_idle_sleep_s: float = Field(
        0.01, ge=0, description="A remote learner with nothing to learn waits this long before answering."
    )
    minibatch_size: Optional[int] = Field(
        None,
        ge=1,
        description="Rows per SGD step of a policy learner, whole sequences (a multiple of "
        "rollout_fragment_length); each of the num_sgd_iter passes shuffles the sequences. None: one step on the "
        "whole train batch per pass.",
    )

    kl_coeff: float = Field(1.0, ge=0, description="Initial KL coefficient (adapted towards kl_target).")

    @model_validator(mode="after")
    def _check_league(self):
        check_whole_sequences(self)
        check_kl_against_target(self)
        check_policy_average(self)
        try:
            builder = make_league_builder(self.league)
        except ConfigError as e:
            raise ValueError(f"league: {str(e).rstrip('.')}") from None  # the config's own error adds its name
        learning = [pid for pid, s in builder.initial_policies().items() if s.trainable]
        builder.check_learner_slots(self.max_num_policies_to_train)
        check_average_opponent(self, builder)
        check_learner_groups(self, learning)
        if len(learning) > self.max_num_policies_to_train:
            raise ValueError(
                f"the league starts with {len(learning)} learning policies but max_num_policies_to_train is "
                f"{self.max_num_policies_to_train}; raise it or configure fewer learning players"
            )
        T = self.fragment_length()
        if self.minibatch_size is not None and self.minibatch_size % T:
            raise ValueError(
                f"minibatch_size ({self.minibatch_size}) must be a multiple of rollout_fragment_length "
                f"({T}): minibatches are whole V-trace sequences, e.g. {max(T, self.minibatch_size // T * T)}"
            )
        if self.minibatch_size is not None and self.minibatch_size > self.train_batch_size:
            raise ValueError(
                f"minibatch_size ({self.minibatch_size}) is larger than train_batch_size "
                f"({self.train_batch_size}); lower it or leave it unset (one step on the whole batch)"
            )
        n = self.resources.num_learner_shards
        if self.resources.remote_learners and self.resources.num_workers == 0:
            raise ValueError(
                "resources.remote_learners: true needs Ray, i.e. resources.num_workers >= 1 "
                "(num_workers: 0 keeps everything in the driver)"
            )
        if n is not None and n > self.max_num_policies_to_train:
            raise ValueError(
                f"resources.num_learner_shards ({n}) must not exceed max_num_policies_to_train "
                f"({self.max_num_policies_to_train})"
            )
        return self
