"""APPO: IMPALA's asynchronous pipeline with a PPO-style clipped surrogate and a target network.

Reads in order: config, loss, training_step. APPO reuses IMPALA's functions (sequences, the
learner and its thread) and the :class:`~shoal.algorithms.pipeline.AsyncPipeline`, not
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

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

import torch
from pydantic import Field, model_validator

from shoal.algorithms.config_groups import (
    ASYNC_PER_RUN_KEYS,
    AsyncSamplingKeys,
    ClipTargetKeys,
    KLPenaltyKeys,
    LearnerGroupResources,
    LearnerThreadKeys,
    MultiAgentKeys,
    VTraceKeys,
    check_kl_against_target,
    check_learner_group,
    check_learner_thread,
    check_multi_agent,
    check_whole_sequences,
)
from shoal.algorithms.pipeline import AsyncAlgorithm, make_async_policy_learner
from shoal.batch import Col
from shoal.config import AlgorithmConfig
from shoal.learn.losses import LossRecord
from shoal.learn.masking import ActionMasked
from shoal.learn.sequences import VTraceParams, policy_advantages, time_major, unroll, value_and_entropy, vtrace_for
from shoal.learn.stats import STANDARDIZE_SUMS, masked_mean
from shoal.learn.target import AdaptiveKL, TargetNetwork
from shoal.logging.metrics import Phase
from shoal.models.recurrent import run_sequences


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


# ---- loss -------------------------------------------------------------------------------
def appo_loss_terms(
    logp,
    target_logp,
    pg_advantages,
    values,
    vs,
    entropy,
    valid,
    kl=None,
    *,
    clip_param: float,
    vf_loss_coeff: float,
    entropy_coeff: float,
    kl_coeff: float = 0.0,
) -> dict[str, torch.Tensor]:
    """The APPO objective (means over the valid steps); ``total_loss`` is minimised.

    r           = exp(logp - target_logp)
    policy_loss = -mean(min(r * A, clip(r, 1 - eps, 1 + eps) * A))
    vf_loss     = 0.5 * mean((V - vs)^2)
    total_loss  = policy_loss + vf_loss_coeff * vf_loss - entropy_coeff * mean(H) + kl_coeff * mean(KL)
    """
    ratio = torch.exp(logp - target_logp)
    surr = torch.min(ratio * pg_advantages, ratio.clamp(1 - clip_param, 1 + clip_param) * pg_advantages)
    policy_loss = -masked_mean(surr, valid)
    vf_loss, mean_entropy = value_and_entropy(values, vs, entropy, valid)
    total = policy_loss + vf_loss_coeff * vf_loss - entropy_coeff * mean_entropy
    if kl is not None:
        mean_kl = masked_mean(kl, valid)
        total = total + kl_coeff * mean_kl
    else:  # report the low-variance estimate of KL(pi_target || pi)
        mean_kl = masked_mean((ratio - 1) - (logp - target_logp), valid).detach()
    return {
        "total_loss": total,
        "policy_loss": policy_loss,
        "vf_loss": vf_loss,
        "entropy": mean_entropy,
        "kl": mean_kl,
        "clip_fraction": masked_mean(((ratio - 1).abs() > clip_param).float(), valid),
    }


@dataclass(frozen=True)
class APPOLoss(LossRecord):
    """APPO's loss (:func:`appo_loss_terms`: the clipped surrogate against the target network,
    V-trace with the target as its target policy) from the keys it reads; a Learner's
    ``loss_fn``. ``target``: the learner's target network; ``kl``: the KL penalty's coefficient
    when ``use_kl_loss`` is on. A batch with ``ACTION_MASK`` (an env or game with action masks) has
    both networks' logits masked by it."""

    seq_len: int  # T, the rollout fragment length: rows per sequence
    gamma: float
    vtrace: VTraceParams
    normalize_advantages: bool
    clip_param: float
    vf_loss_coeff: float
    entropy_coeff: float
    target: TargetNetwork = dataclasses.field(compare=False)
    kl: Optional[AdaptiveKL] = dataclasses.field(default=None, compare=False)

    @classmethod
    def config_values(cls, cfg) -> dict[str, Any]:
        return {
            "seq_len": cfg.fragment_length(),
            "gamma": cfg.gamma,
            "vtrace": VTraceParams.from_config(cfg),
            "normalize_advantages": cfg.normalize_advantages,
            "clip_param": cfg.clip_param,
            "vf_loss_coeff": cfg.vf_loss_coeff,
            "entropy_coeff": cfg.entropy_coeff,
        }

    def group_sum_sizes(self) -> tuple[int, ...]:
        return (STANDARDIZE_SUMS,) if self.normalize_advantages else ()  # policy_advantages over the group

    def _target_net(self, module, batch: dict):
        """The target network beside ``module`` (a per-device copy on a multi-device learner)."""
        if Col.ACTION_MASK in batch:  # ``module`` is the masked view: the target's logits get the same mask
            return ActionMasked(self.target.for_module(module.module), batch[Col.ACTION_MASK])
        return self.target.for_module(module)

    def __call__(self, module, batch: dict, learner=None) -> tuple[torch.Tensor, dict]:
        if Col.ACTION_MASK in batch:
            module = ActionMasked(module, batch[Col.ACTION_MASK])
        T = self.seq_len
        u = unroll(module, batch, T, self.gamma)
        with torch.no_grad():
            target_net = self._target_net(module, batch)
            if getattr(module, "recurrent", False):
                target_inputs = run_sequences(target_net, batch, T)[0]
            else:
                target_inputs, _ = target_net(batch[Col.OBS])
            target_dist = module.dist_cls(target_inputs)
            target_logp = time_major(target_dist.logp(batch[Col.ACTIONS]), T)
        vt = vtrace_for(u, target_logp, self.vtrace)
        advantages = policy_advantages(vt, u, self.normalize_advantages, learner)
        kl = self.kl if self.kl is not None and self.kl.enabled else None
        kl_terms = time_major(target_dist.kl(u.dist), T) if kl is not None else None
        terms = appo_loss_terms(
            u.logp,
            target_logp,
            advantages,
            u.values,
            vt.vs,
            u.entropy,
            u.valid,
            kl_terms,
            clip_param=self.clip_param,
            vf_loss_coeff=self.vf_loss_coeff,
            entropy_coeff=self.entropy_coeff,
            kl_coeff=kl.coeff if kl is not None else 0.0,
        )
        loss = terms.pop("total_loss")
        stats = {k: v.detach() for k, v in terms.items()}
        stats["mean_rho"] = masked_mean(vt.rhos, u.valid)
        return loss, stats


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

    def _after_update(self, pid, stats: dict[str, Any]) -> None:
        """A policy's KL coefficient moves on a learner result; a learner group's members move their
        own (on their own measurements: the averaged gradients keep the replicas equal), and the
        driver's copy mirrors learner 0's."""
        pl = self.policies[pid]
        if self.learner_group is None:
            pl.after_update(stats)
        elif "kl_coeff" in stats:
            pl.kl.coeff = float(stats["kl_coeff"])

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
            results = p.drain(wait=not ready)
        with self.timers.time(Phase.POST_UPDATE):  # each policy's KL coefficient moves (when its target refreshed)
            for result in results:
                self.counters["env_steps_trained"] += result.env_steps
                for pid, stats in self.policies.split_stats(result.stats).items():
                    self._after_update(pid, stats)
        with self.timers.time(Phase.SYNC):
            if p.broadcast_due():
                p.broadcast_done()
                self.broadcast_weights()
        p.check()
        now = {pid: {"lr": pl.learner.lr, **pl.learner.schedule_stats(), **pl.kl_stats()} for pid, pl in self.policies}
        return {**p.metrics(), **self.policies.result_keys(now)}
