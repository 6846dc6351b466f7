"""IMPALA: asynchronous sampling, V-trace, a background learner thread.

Reads in order: config, loss, the learner, training_step. The asynchronous data path
(sample requests in flight, train-batch assembly, the learner thread's results, the
broadcast schedule) is an :class:`~shoal.framework.pipeline.AsyncPipeline` that owns its
state; ``training_step`` calls its phases in order. APPO builds the same parts (from
:mod:`shoal.framework.pipeline`) and unrolls the same sequences (:mod:`shoal.learn.sequences`).

Rollout actors return their fragments time-major, one sequence of ``T =
rollout_fragment_length`` steps per env, laid out sequence after sequence (rows = sequences
x T, including the masked autoreset rows). The loss views each column as ``(T, sequences)``
again, recomputes values with the current network and runs V-trace over it
(:mod:`shoal.learn.vtrace` explains how reset rows, termination and truncation are handled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from pydantic import Field, model_validator

from shoal.algorithms.loss_keys import VTraceKeys
from shoal.batch import Col
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
from shoal.learn.losses import LossRecord
from shoal.learn.masking import ActionMasked
from shoal.learn.sequences import VTraceParams, policy_advantages, unroll, value_and_entropy, vtrace_for
from shoal.learn.stats import STANDARDIZE_SUMS, masked_mean
from shoal.logging.metrics import Phase


# ---- config -----------------------------------------------------------------------------
class IMPALAConfig(VTraceKeys, AsyncSamplingKeys, LearnerThreadKeys, MultiAgentKeys, AlgorithmConfig):
    """AlgorithmConfig + V-trace + asynchronous sampling + the learner thread (key groups)."""

    algo = "impala"
    mutable_keys = AlgorithmConfig.mutable_keys | {"vf_loss_coeff", "entropy_coeff"}
    lstm_sequences = "fragments"

    resources: LearnerGroupResources = Field(
        default_factory=LearnerGroupResources, description="Where things run: rollout actors and learners."
    )

    @model_validator(mode="after")
    def _check_impala(self):
        check_whole_sequences(self)
        check_learner_thread(self)
        check_learner_group(self)
        check_multi_agent(self, ASYNC_PER_RUN_KEYS)
        return self


# ---- loss -------------------------------------------------------------------------------
def impala_loss_terms(
    logp, entropy, values, vs, pg_advantages, valid, *, vf_loss_coeff: float, entropy_coeff: float
) -> dict[str, torch.Tensor]:
    """The IMPALA objective (means over the valid steps); ``total_loss`` is minimised.

    policy_loss = -mean(logp * A)           A: V-trace pg advantages
    vf_loss     = 0.5 * mean((V - vs)^2)    vs: V-trace targets
    total_loss  = policy_loss + vf_loss_coeff * vf_loss - entropy_coeff * mean(H)
    """
    policy_loss = -masked_mean(logp * pg_advantages, valid)
    vf_loss, mean_entropy = value_and_entropy(values, vs, entropy, valid)
    total = policy_loss + vf_loss_coeff * vf_loss - entropy_coeff * mean_entropy
    return {"total_loss": total, "policy_loss": policy_loss, "vf_loss": vf_loss, "entropy": mean_entropy}


@dataclass(frozen=True)
class IMPALALoss(LossRecord):
    """IMPALA's loss (:func:`impala_loss_terms` on V-trace over whole sequences) from the keys it
    reads; a Learner's ``loss_fn``. A batch with ``ACTION_MASK`` has the logits masked by it."""

    seq_len: int  # T, the rollout fragment length: rows per sequence
    gamma: float
    vtrace: VTraceParams
    normalize_advantages: bool
    vf_loss_coeff: float
    entropy_coeff: float

    @classmethod
    def config_values(cls, cfg) -> dict[str, Any]:
        return {
            "seq_len": cfg.fragment_length(),
            "gamma": cfg.gamma,
            "vtrace": VTraceParams.from_config(cfg),
            "normalize_advantages": cfg.normalize_advantages,
            "vf_loss_coeff": cfg.vf_loss_coeff,
            "entropy_coeff": cfg.entropy_coeff,
        }

    def group_sum_sizes(self) -> tuple[int, ...]:
        return (STANDARDIZE_SUMS,) if self.normalize_advantages else ()  # policy_advantages over the group

    def __call__(self, module, batch: dict, learner=None) -> tuple[torch.Tensor, dict]:
        if Col.ACTION_MASK in batch:
            module = ActionMasked(module, batch[Col.ACTION_MASK])
        u = unroll(module, batch, self.seq_len, self.gamma)
        vt = vtrace_for(u, u.logp, self.vtrace)
        advantages = policy_advantages(vt, u, self.normalize_advantages, learner)
        terms = impala_loss_terms(
            u.logp,
            u.entropy,
            u.values,
            vt.vs,
            advantages,
            u.valid,
            vf_loss_coeff=self.vf_loss_coeff,
            entropy_coeff=self.entropy_coeff,
        )
        loss = terms.pop("total_loss")
        stats = {k: v.detach() for k, v in terms.items()}
        stats["mean_rho"] = masked_mean(vt.rhos, u.valid)
        return loss, stats


# ---- algorithm --------------------------------------------------------------------------
class IMPALA(AsyncAlgorithm):
    config_cls = IMPALAConfig
    config: IMPALAConfig

    @classmethod
    def _policy_learner(cls, cfg, obs_space, action_space, seed: Optional[int] = None, **learner_kwargs):
        return make_async_policy_learner(
            cfg, obs_space, action_space, seed, lambda c, target, kl: IMPALALoss.from_config(c), **learner_kwargs
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
            for result in p.drain(wait=not ready):
                self.counters["env_steps_trained"] += result.env_steps
        with self.timers.time(Phase.SYNC):
            if p.broadcast_due():
                p.broadcast_done()
                self.broadcast_weights()
        p.check()
        return {
            **p.metrics(),
            **self.policies.result_keys(
                {pid: {"lr": pl.learner.lr, **pl.learner.schedule_stats()} for pid, pl in self.policies}
            ),
        }
