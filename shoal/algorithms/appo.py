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
  (:class:`~shoal.learn.target.AdaptiveKL`) moves towards ``kl_target`` once per learner
  result, in the driver's post-update phase of ``training_step``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from pydantic import model_validator

from shoal.algorithms.base import Algorithm
from shoal.algorithms.config_groups import (AsyncSamplingKeys, ClipTargetKeys, KLPenaltyKeys, LearnerThreadKeys,
                                           MultiAgentKeys, VTraceKeys, check_learner_thread, check_multi_agent,
                                           check_whole_sequences)
from shoal.algorithms.impala import (make_async_learner, make_learner_thread, make_sequence_runners, masked_mean,
                                     policy_advantages, time_major, unroll, value_and_entropy, vtrace_for)
from shoal.algorithms.pipeline import AsyncPipeline
from shoal.batch import Col
from shoal.config import AlgorithmConfig
from shoal.learn import Learner
from shoal.learn.target import AdaptiveKL, TargetNetwork
from shoal.models.recurrent import run_sequences
from shoal.logging.metrics import Phase
from shoal.rollout import ActorCriticPolicy


# ---- config -----------------------------------------------------------------------------
class APPOConfig(VTraceKeys, AsyncSamplingKeys, ClipTargetKeys, KLPenaltyKeys, LearnerThreadKeys, MultiAgentKeys,
                 AlgorithmConfig):
    """IMPALA's groups plus the clipped surrogate, its target network and the KL penalty."""

    algo = "appo"
    mutable_keys = AlgorithmConfig.mutable_keys | {"vf_loss_coeff", "entropy_coeff", "clip_param", "kl_target"}
    lstm_sequences = "fragments"


    @model_validator(mode="after")
    def _check_appo(self):
        check_whole_sequences(self)
        check_learner_thread(self)
        check_multi_agent(self)
        return self


# ---- loss -------------------------------------------------------------------------------
def appo_loss_terms(logp, target_logp, pg_advantages, values, vs, entropy, valid, kl=None, *, clip_param: float,
                    vf_loss_coeff: float, entropy_coeff: float, kl_coeff: float = 0.0) -> dict[str, torch.Tensor]:
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
    return {"total_loss": total, "policy_loss": policy_loss, "vf_loss": vf_loss, "entropy": mean_entropy, "kl": mean_kl,
            "clip_fraction": masked_mean(((ratio - 1).abs() > clip_param).float(), valid)}


def appo_loss(module, batch: dict, learner: Learner, config, target: TargetNetwork,
              kl: AdaptiveKL) -> tuple[torch.Tensor, dict]:
    T = config.fragment_length()
    u = unroll(module, batch, T, config.gamma)
    with torch.no_grad():
        target_net = target.for_module(module)
        if getattr(module, "recurrent", False):
            target_inputs = run_sequences(target_net, batch, T)[0]
        else:
            target_inputs, _ = target_net(batch[Col.OBS])
        target_dist = module.dist_cls(target_inputs)
        target_logp = time_major(target_dist.logp(batch[Col.ACTIONS]), T)
    vt = vtrace_for(u, target_logp, config)
    advantages = policy_advantages(vt, u, config)
    kl_terms = time_major(target_dist.kl(u.dist), T) if config.use_kl_loss else None
    terms = appo_loss_terms(u.logp, target_logp, advantages, u.values, vt.vs, u.entropy, u.valid, kl_terms,
                            clip_param=config.clip_param, vf_loss_coeff=config.vf_loss_coeff,
                            entropy_coeff=config.entropy_coeff, kl_coeff=kl.coeff)
    loss = terms.pop("total_loss")
    stats = {k: v.detach() for k, v in terms.items()}
    stats["mean_rho"] = masked_mean(vt.rhos, u.valid)
    return loss, stats


def make_appo_target(learner: Learner, config) -> TargetNetwork:
    """The target network, refreshed by the learner's post-update hook every ``target_update_frequency`` updates."""
    target = TargetNetwork(learner.module, config.target_update_frequency, unit="updates")
    learner.add_post_update_hook(target.post_update)
    return target


# ---- algorithm --------------------------------------------------------------------------
class APPO(Algorithm):
    config_cls = APPOConfig

    def setup(self) -> None:
        cfg = self.config
        self.policy_cls = ActorCriticPolicy
        self.kl = AdaptiveKL(cfg.kl_coeff, cfg.kl_target, enabled=cfg.use_kl_loss)
        self.learner = make_async_learner(self, self._loss)  # the loss reads self.target, made next
        self.target = make_appo_target(self.learner, cfg)
        self.thread = make_learner_thread(self.learner, cfg)
        self.env_runners = make_sequence_runners(self)
        self.pipeline = AsyncPipeline.from_config(self.env_runners, self.thread, cfg)
        self.broadcast_weights()

    def _loss(self, module, batch: dict, learner: Learner):
        return appo_loss(module, batch, learner, self.config, self.target, self.kl)

    def display_metrics(self) -> list[tuple[str, str]]:
        return super().display_metrics() + [("learner/mean_rho", "mean_rho")]  # V-trace's mean importance ratio

    def get_weights(self) -> dict[str, np.ndarray]:
        return self.thread.get_weights()

    def training_step(self) -> dict[str, Any]:
        p = self.pipeline
        with self.timers.time(Phase.SAMPLE):
            ready = p.sample()
            self.record_rollouts([m for _, m in ready])
        with self.timers.time(Phase.ENQUEUE):
            self.learner.set_env_steps(self.counters["env_steps_sampled"])
            p.enqueue([b for b, _ in ready])
        with self.timers.time(Phase.DRAIN):
            results = p.drain(wait=not ready)
        with self.timers.time(Phase.POST_UPDATE):  # once per learner result: the KL coefficient moves
            for result in results:
                self.counters["env_steps_trained"] += result.env_steps
                if "kl" in result.stats:
                    self.kl.update(result.stats["kl"])
        with self.timers.time(Phase.SYNC):
            if p.broadcast_due():
                p.broadcast_done()
                self.broadcast_weights()
        p.check()
        return {**p.metrics(), "learner/kl_coeff": self.kl.coeff}

    def train(self) -> dict[str, Any]:
        return {**super().train(), **self.thread.stats()}

    def get_state(self) -> dict[str, Any]:
        with self.thread.hold():
            return {**super().get_state(), "learner": self.learner.get_state(), "target": self.target.get_state(),
                    "kl": self.kl.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        with self.thread.hold():
            self.learner.set_state(state["learner"])
            self.target.set_state(state["target"])
            self.kl.set_state(state["kl"])
        self.broadcast_weights()

    def stop(self) -> None:
        self.thread.stop()
        super().stop()
