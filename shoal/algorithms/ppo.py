"""PPO: clipped surrogate on GAE advantages, synchronous sampling, minibatch SGD.

Reads in order: config, training_step. The loss and the postprocessing that computes its
advantages live in ``ppo_loss.py`` (:class:`~shoal.algorithms.ppo_loss.PPOLoss`,
:func:`~shoal.algorithms.ppo_loss.gae_postprocess`), shared with DD-PPO.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Optional

import numpy as np
import torch
from pydantic import Field, model_validator

from shoal.algorithms.loss_keys import KLPenaltyKeys, PPOLossKeys
from shoal.algorithms.ppo_loss import PPOLoss, gae_postprocess, sgd_sequence_length
from shoal.batch import Batch, Col
from shoal.config import AlgorithmConfig
from shoal.framework.base import Algorithm
from shoal.framework.config_groups import MultiAgentKeys, check_multi_agent
from shoal.framework.multi_agent import sequence_length
from shoal.framework.policies import PolicySet, build_policy_module
from shoal.framework.runner import Learned
from shoal.learn import Learner, resolve_device
from shoal.learn.masking import ActionMasked
from shoal.learn.policy_learner import PolicyLearner
from shoal.learn.target import KLAdaptiveLR
from shoal.logging.metrics import Phase
from shoal.models import build_actor_critic
from shoal.models.recurrent import run_sequences
from shoal.rollout import ActorCriticPolicy, compute_gae


# ---- config -----------------------------------------------------------------------------
class PPOConfig(PPOLossKeys, KLPenaltyKeys, MultiAgentKeys, AlgorithmConfig):
    """AlgorithmConfig + PPO's loss and SGD keys + the adaptive KL penalty (``loss_keys.py``)."""

    algo = "ppo"
    mutable_keys = AlgorithmConfig.mutable_keys | {
        "clip_param",
        "vf_clip_param",
        "vf_loss_coeff",
        "entropy_coeff",
        "kl_target",
    }
    lstm_sequences = "max_seq_len"
    # Pendulum-v1, 200k env steps, 2 seeds, mean of the last 20 episodes: -997/-982 with the plain
    # defaults, -150/-138 with reward normalization alone, -1085/-1122 with observation normalization
    # alone (the target for these defaults: -400).
    box_action_defaults = {"normalize.reward": True}

    train_batch_size: int = Field(4096, ge=1, description="Env steps per training step (over all rollout actors).")
    kl_coeff: float = Field(0.2, ge=0, description="Initial KL penalty coefficient (adapted towards kl_target).")
    lr_kl_target: Optional[float] = Field(
        None,
        gt=0,
        description="Adapt the learning rate to the policy's step size (rl_games' adaptive schedule): "
        "after each epoch, a mean KL(old || new) above twice this divides lr by 1.5, one below half of it "
        "multiplies lr by 1.5, within [1e-6, 1e-2]; lr is where it starts. None: lr stays (or follows "
        "lr_schedule).",
    )

    @model_validator(mode="after")
    def _check_lr_kl_target(self):
        if self.lr_kl_target is not None and self.lr_schedule:
            raise ValueError("lr_kl_target adapts the learning rate and lr_schedule sets it: give one of them")
        if self.lr_kl_target is not None and self.multi_agent is not None:
            raise ValueError(
                "lr_kl_target is not supported with a multi_agent section yet (each policy learns with "
                "its own learner); leave it out, or use lr_schedule"
            )
        return self

    @model_validator(mode="after")
    def _check_ppo_multi_agent(self):
        check_multi_agent(self)
        return self

    @model_validator(mode="after")
    def _check_ppo_batch(self):
        if self.minibatch_size > self.train_batch_size:
            raise ValueError(
                f"minibatch_size ({self.minibatch_size}) is larger than train_batch_size ({self.train_batch_size}); "
                "it must be at most the train batch"
            )
        n = self.resources.num_envs_per_worker * max(self.resources.num_workers, 1)
        if isinstance(self.rollout_fragment_length, int) and "train_batch_size" in self.model_fields_set:
            if self.rollout_fragment_length * n != self.train_batch_size:
                raise ValueError(
                    f"train_batch_size ({self.train_batch_size}) must equal rollout_fragment_length x num_envs_per_worker "
                    f"x max(num_workers, 1) = {self.rollout_fragment_length} x {n} when both are set; set only one of them"
                )
        return self

    def fragment_length(self) -> int:
        """Steps per env per sampling round: one round per training step fills the train batch."""
        if isinstance(self.rollout_fragment_length, int):
            return self.rollout_fragment_length
        n = self.resources.num_envs_per_worker * max(self.resources.num_workers, 1)
        frag = max(1, math.ceil(self.train_batch_size / n))
        if self.model.is_recurrent():  # whole training sequences: up to the next multiple of max_seq_len
            frag = -(-frag // self.model.max_seq_len) * self.model.max_seq_len
        return frag

    def to_dict(self, redact: bool = False) -> dict[str, Any]:
        d = super().to_dict(redact)
        # With an integer rollout_fragment_length and no explicit train_batch_size, the batch is derived
        # from the fragment: leave the unused default out, or from_dict() (checkpoints, copy_with)
        # would take it as explicitly set and reject the config it came from.
        if isinstance(self.rollout_fragment_length, int) and "train_batch_size" not in self.model_fields_set:
            d.pop("train_batch_size", None)
        return d


# ---- algorithm --------------------------------------------------------------------------
class PPO(Algorithm):
    config_cls = PPOConfig
    config: PPOConfig
    policies: PolicySet  # built by setup()
    policy_cls = ActorCriticPolicy

    def setup(self) -> None:
        cfg: PPOConfig = self.config
        self.policies = self.build_policies(self._policy_learner)
        if not self.is_multi_agent:
            self.learner, self.kl = self.policies.only.learner, self.policies.only.kl
        self.lr_by_kl = KLAdaptiveLR(cfg.lr_kl_target) if cfg.lr_kl_target is not None else None
        postprocess = functools.partial(gae_postprocess, gamma=cfg.gamma, gae_lambda=cfg.gae_lambda)
        self.env_runners = self.make_env_runners(ActorCriticPolicy, postprocess, cfg.fragment_length())
        self.runner = self.policies.local_runner(self._learn)  # each policy learns in the driver
        self.broadcast_weights()

    def _policy_learner(self, cfg: PPOConfig, obs_space, action_space, seed: Optional[int] = None) -> PolicyLearner:
        """One policy's learner: PPO's loss (under the recorded action masks in a multi-agent game)."""
        module = build_policy_module(build_actor_critic, obs_space, action_space, cfg.model, seed)
        return PolicyLearner(
            module,
            cfg,
            lambda c, target, kl: PPOLoss.from_config(c, kl=kl),
            device=resolve_device(cfg.resources.num_gpus),
        )

    def training_step(self) -> dict[str, Any]:
        with self.timers.time(Phase.SAMPLE):
            results = self.env_runners.foreach("sample")
            if not results:  # every rollout actor failed this round (they were recreated)
                return {}
            self.record_rollouts([m for _, m in results])
            batches = self.policies.batches(b for b, _ in results)
        stats = {}
        with self.timers.time(Phase.LEARN):  # each policy's update, then its KL coefficient moves (the runner)
            self.runner.submit(batches)
            for r in self.runner.results():
                assert r.policy_id is not None, "a runner's results name their policy"
                stats[r.policy_id] = r.stats
                self.counters["env_steps_trained"] += r.env_steps
        with self.timers.time(Phase.SYNC):
            self.broadcast_weights()
        return self.policies.result_keys(stats)

    def _learn(self, pl: PolicyLearner, batch: Batch) -> Learned:
        """``num_sgd_iter`` epochs of minibatches (the runner's ``learn``); in a multi-agent game GAE is
        computed here first, from the network that sampled the batch (weights move only between rounds)."""
        cfg = pl.config
        steps = batch.valid_rows()
        pl.learner.set_env_steps(self.counters["env_steps_sampled"])
        if self.is_multi_agent:
            batch = learner_side_gae(pl.learner, batch, sequence_length(cfg), cfg.gamma, cfg.gae_lambda)
        stats = pl.learner.update(
            batch,
            cfg.num_sgd_iter,
            cfg.minibatch_size,
            self.rng,
            sequence_length=sgd_sequence_length(cfg),
            on_epoch=self._adapt_lr if self.lr_by_kl is not None else None,
        )
        return Learned(stats, steps)

    def _adapt_lr(self, epoch_stats: dict[str, float]) -> None:
        """With ``lr_kl_target``: the next epoch's learning rate from this epoch's mean KL."""
        assert self.lr_by_kl is not None
        self.learner.set_lr(self.lr_by_kl.next_lr(self.learner.lr, epoch_stats["kl"]))

    def display_metrics(self) -> list[tuple[str, str]]:
        return self.policies.display(super().display_metrics())

    def get_state(self) -> dict[str, Any]:
        extra = {} if self.is_multi_agent else {"lr": self.learner.lr}
        return {**super().get_state(), **extra}

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        if self.lr_by_kl is not None and "lr" in state:  # where the adaptation had taken it
            self.learner.set_lr(float(state["lr"]))
        self.broadcast_weights()


@torch.no_grad()
def learner_side_gae(learner: Learner, batch: Batch, T: int, gamma: float, gae_lambda: float) -> Batch:
    """PPO's columns for a multi-agent batch of sequences of ``T`` decisions, computed in the
    learner: the behaviour logits and values of the current network (which sampled the batch)
    and GAE over each sequence. A row's chain stops at termination and before a reset row;
    after the sequence's last row it bootstraps from the value of that row's next observation."""
    t = batch.to_torch(learner.device)
    module = ActionMasked(learner.module, t[Col.ACTION_MASK])
    if module.recurrent:  # the next row's value, and after a sequence the value from its final state
        inputs, values, final = run_sequences(module, t, T)
        last = t[Col.NEXT_OBS].reshape(-1, T, *t[Col.NEXT_OBS].shape[1:])[:, -1]
        seq_values = values.reshape(-1, T)
        next_values = torch.cat([seq_values[:, 1:], module.value_step(last, final)[:, None]], dim=1).reshape(-1)
    else:
        inputs, values = module(t[Col.OBS])
        next_values = module.value(t[Col.NEXT_OBS])

    def tm(x: np.ndarray) -> np.ndarray:  # rows, sequence after sequence -> (T, sequences)
        return x.reshape(-1, T).T

    valid, term = tm(batch[Col.VALID]), tm(batch[Col.TERMINATEDS])
    next_valid = np.concatenate([valid[1:], np.ones_like(valid[:1])])
    adv = compute_gae(
        tm(batch[Col.REWARDS]),
        tm(values.cpu().numpy()),
        tm(next_values.cpu().numpy()),
        term,
        term | ~next_valid,
        gamma,
        gae_lambda,
    )
    out = Batch(dict(batch.items()))
    v = values.cpu().numpy()
    out[Col.ADVANTAGES] = adv.T.reshape(-1)
    out[Col.VALUE_TARGETS] = out[Col.ADVANTAGES] + v
    out[Col.VF_PREDS] = v
    out[Col.ACTION_DIST_INPUTS] = inputs.cpu().numpy()
    return out
