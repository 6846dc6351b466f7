"""APPO: IMPALA's asynchronous pipeline with a PPO-style clipped surrogate and a target network.

Reads in order: config, training_step; the loss is in ``appo_loss.py`` (shared with the
league's policy learner). APPO reuses IMPALA's functions (sequences, the
learner and its thread) and the :class:`~shoal.framework.pipeline.AsyncPipeline`, not
IMPALA's class.

The design, kept simple:

- The target network (:class:`~shoal.learn.target.TargetNetwork`) is a frozen copy of the
  learner's network, refreshed every ``target_update_frequency`` learner updates by the
  learner's post-update hook (in the learner thread, right after an optimizer step, so a
  refresh never races an update). It plays PPO's "old policy": V-trace is computed with it
  as the target policy (``rho = pi_target / mu``, mu the behaviour policy that sampled), so
  the advantages estimate how good an action is for the target policy. A device replica of
  the multi-device learner gets its own copy, re-synced whenever the master copy changes.
- The surrogate ratio is ``r = pi / pi_target`` (current vs target network), clipped to
  ``[1 - clip_param, 1 + clip_param]``: ``policy_loss = -mean(min(r A, clip(r) A))``.
  (mu's mismatch is already corrected by V-trace's clipped pg-rho in A.)
- Values come from the current network and regress onto the V-trace targets.
- Optional KL term ``kl_coeff * KL(pi_target || pi)``; the coefficient
  (:class:`~shoal.learn.target.AdaptiveKL`) moves towards ``kl_target`` in the driver's
  post-update phase of ``training_step``, once per target refresh, on the KL the period's last
  update measured against the target (``learner/period_kl``): the policy's movement over a
  target period, which is what the penalty holds near ``kl_target``. A result's mean KL would
  not do: it averages updates right after a refresh, where the KL is 0.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import Field, model_validator

from shoal.algorithms.appo_loss import APPOLoss
from shoal.algorithms.loss_keys import ClipTargetKeys, KLPenaltyKeys, VTraceKeys, check_kl_against_target
from shoal.config import AlgorithmConfig
from shoal.framework.config_groups import (
    ASYNC_PER_RUN_KEYS,
    AsyncSamplingKeys,
    LearnerGroupResources,
    LearnerThreadKeys,
    MultiAgentKeys,
    check_learner_group,
    check_learner_thread,
    check_multi_agent,
    check_whole_sequences,
)
from shoal.framework.pipeline import AsyncAlgorithm, make_async_policy_learner
from shoal.logging.metrics import Phase


# ---- config -----------------------------------------------------------------------------
class APPOConfig(
    VTraceKeys, AsyncSamplingKeys, ClipTargetKeys, KLPenaltyKeys, LearnerThreadKeys, MultiAgentKeys, AlgorithmConfig
):
    """IMPALA's groups plus the clipped surrogate, its target network and the KL penalty."""

    algo = "appo"
    mutable_keys = AlgorithmConfig.mutable_keys | {"vf_loss_coeff", "entropy_coeff", "clip_param", "kl_target"}
    lstm_sequences = "fragments"

    resources: LearnerGroupResources = Field(
        default_factory=LearnerGroupResources, description="Where things run: rollout actors and learners."
    )

    @model_validator(mode="after")
    def _check_appo(self):
        check_whole_sequences(self)
        check_learner_thread(self)
        check_learner_group(self)
        check_kl_against_target(self)
        check_multi_agent(self, ASYNC_PER_RUN_KEYS)
        return self


# ---- algorithm --------------------------------------------------------------------------
class APPO(AsyncAlgorithm):
    config_cls = APPOConfig
    config: APPOConfig

    def setup(self) -> None:
        super().setup()
        if not self.is_multi_agent:
            only = self.policies.only
            self.target, self.kl = only.target, only.kl

    @classmethod
    def _policy_learner(cls, cfg, obs_space, action_space, seed: Optional[int] = None, **learner_kwargs):
        """One policy's learner, with its target network: refreshed by the learner's post-update hook
        every ``target_update_frequency`` updates."""
        return make_async_policy_learner(
            cfg,
            obs_space,
            action_space,
            seed,
            lambda c, target, kl: APPOLoss.from_config(c, target=target, kl=kl),
            target_period=cfg.target_update_frequency,
            **learner_kwargs,
        )

    def training_step(self) -> dict[str, Any]:
        p = self.pipeline
        with self.timers.time(Phase.SAMPLE):
            ready = p.sample()
            self.record_rollouts([m for _, m in ready])
        with self.timers.time(Phase.ENQUEUE):
            for _, pl in self.policies:
                pl.learner.set_env_steps(self.counters["env_steps_sampled"])
            p.enqueue([b for b, _ in ready])
        with self.timers.time(Phase.DRAIN):
            # each result's KL coefficient has moved in the runner (when its target refreshed)
            for result in p.drain(wait=not ready):
                self.counters["env_steps_trained"] += result.env_steps
        with self.timers.time(Phase.SYNC):
            if p.broadcast_due():
                p.broadcast_done()
                self.broadcast_weights()
        p.check()
        now = {pid: {"lr": pl.learner.lr, **pl.learner.schedule_stats(), **pl.kl_stats()} for pid, pl in self.policies}
        return {**p.metrics(), **self.policies.result_keys(now)}
