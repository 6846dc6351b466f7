"""IMPALA: asynchronous sampling, V-trace, a background learner thread.

Reads in order: config, loss, the learner, training_step. The asynchronous data path
(sample requests in flight, train-batch assembly, the learner thread's results, the
broadcast schedule) is an :class:`~shoal.algorithms.pipeline.AsyncPipeline` that owns its
state; ``training_step`` calls its phases in order. APPO reuses the functions here, not the
class.

Rollout actors return their fragments time-major, one sequence of ``T =
rollout_fragment_length`` steps per env, laid out sequence after sequence (rows = sequences
x T, including the masked autoreset rows). The loss views each column as ``(T, sequences)``
again, recomputes values with the current network and runs V-trace over it
(:mod:`shoal.learn.vtrace` explains how reset rows, termination and truncation are handled).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from pydantic import model_validator

from shoal.algorithms.base import Algorithm
from shoal.algorithms.config_groups import (AsyncSamplingKeys, LearnerThreadKeys, MultiAgentKeys, VTraceKeys,
                                           check_learner_thread, check_multi_agent, check_whole_sequences)
from shoal.algorithms.pipeline import AsyncPipeline
from shoal.batch import Batch, Col
from shoal.config import AlgorithmConfig
from shoal.learn import Learner, resolve_device
from shoal.learn.stats import masked_mean, standardize
from shoal.learn.vtrace import VTraceReturns, vtrace
from shoal.models import build_actor_critic
from shoal.models.recurrent import pack_state, run_sequences
from shoal.rollout import ActorCriticPolicy, Fragment
from shoal.rollout.postprocessing import env_major
from shoal.logging.metrics import Phase


# ---- config -----------------------------------------------------------------------------
class IMPALAConfig(VTraceKeys, AsyncSamplingKeys, LearnerThreadKeys, MultiAgentKeys, AlgorithmConfig):
    """AlgorithmConfig + V-trace + asynchronous sampling + the learner thread (config_groups.py)."""

    algo = "impala"
    mutable_keys = AlgorithmConfig.mutable_keys | {"vf_loss_coeff", "entropy_coeff"}
    lstm_sequences = "fragments"


    @model_validator(mode="after")
    def _check_impala(self):
        check_whole_sequences(self)
        check_learner_thread(self)
        check_multi_agent(self)
        return self


# ---- loss -------------------------------------------------------------------------------
def sequence_postprocess(fragment: Fragment) -> Batch:
    """Worker-side: keep every step (reset rows masked by VALID), one env's T steps after another;
    a recurrent policy's state at each fragment's start rides along (``STATE_IN``)."""
    seq = env_major  # (T, N, ...) -> rows, one env's T steps after another
    state = {}
    if fragment.state_in is not None:
        state[Col.STATE_IN] = pack_state(fragment.state_in[0], len(fragment.rewards))
    return Batch({
        **state,
        Col.OBS: seq(fragment.obs[:-1]),
        Col.NEXT_OBS: seq(fragment.obs[1:]),
        Col.ACTIONS: seq(fragment.actions),
        Col.ACTION_LOGP: seq(fragment.extras[Col.ACTION_LOGP]),
        Col.REWARDS: seq(fragment.rewards),
        Col.TERMINATEDS: seq(fragment.terminateds),
        Col.VALID: seq(fragment.valid),
    })


def time_major(x: torch.Tensor, T: int) -> torch.Tensor:
    """Rows laid out sequence after sequence -> (T, sequences, ...)."""
    return x.reshape(-1, T, *x.shape[1:]).transpose(0, 1)


@dataclass
class Unroll:
    """The current network over a batch of sequences, time-major (T, B)."""

    dist: Any  # action distribution over the flat rows
    logp: torch.Tensor
    entropy: torch.Tensor
    values: torch.Tensor
    bootstrap: torch.Tensor  # (B,) value of the observation after each sequence
    behaviour_logp: torch.Tensor
    rewards: torch.Tensor
    discounts: torch.Tensor  # gamma, or 0 where the episode terminated
    valid: torch.Tensor


def unroll(module, batch: dict, T: int, gamma: float) -> Unroll:
    last_next_obs = time_major(batch[Col.NEXT_OBS], T)[-1]
    if getattr(module, "recurrent", False):  # the core over each whole fragment, from its recorded state
        inputs, values, final_state = run_sequences(module, batch, T)
        # after a last row that reset its env, the observation is a new episode's first: zero state
        final_state = final_state * time_major(batch[Col.VALID], T)[-1].to(final_state.dtype)[:, None]
        bootstrap = module.value_step(last_next_obs, final_state)
    else:
        inputs, values = module(batch[Col.OBS])
        bootstrap = module.value(last_next_obs)
    dist = module.dist_cls(inputs)
    return Unroll(
        dist=dist,
        logp=time_major(dist.logp(batch[Col.ACTIONS]), T),
        entropy=time_major(dist.entropy(), T),
        values=time_major(values, T),
        bootstrap=bootstrap,
        behaviour_logp=time_major(batch[Col.ACTION_LOGP], T),
        rewards=time_major(batch[Col.REWARDS], T),
        discounts=gamma * (1.0 - time_major(batch[Col.TERMINATEDS], T).float()),
        valid=time_major(batch[Col.VALID], T),
    )


def vtrace_for(u: Unroll, target_logp: torch.Tensor, config: VTraceKeys) -> VTraceReturns:
    """V-trace with ``target_logp`` as the target policy (the current network for IMPALA)."""
    return vtrace(target_logp.detach() - u.behaviour_logp, u.discounts, u.rewards, u.values.detach(), u.bootstrap.detach(),
                  u.valid, clip_rho_threshold=config.vtrace_clip_rho_threshold,
                  clip_pg_rho_threshold=config.vtrace_clip_pg_rho_threshold, lambda_=config.vtrace_lambda)


def impala_loss_terms(logp, entropy, values, vs, pg_advantages, valid, *, vf_loss_coeff: float,
                      entropy_coeff: float) -> dict[str, torch.Tensor]:
    """The IMPALA objective (means over the valid steps); ``total_loss`` is minimised.

    policy_loss = -mean(logp * A)           A: V-trace pg advantages
    vf_loss     = 0.5 * mean((V - vs)^2)    vs: V-trace targets
    total_loss  = policy_loss + vf_loss_coeff * vf_loss - entropy_coeff * mean(H)
    """
    policy_loss = -masked_mean(logp * pg_advantages, valid)
    vf_loss, mean_entropy = value_and_entropy(values, vs, entropy, valid)
    total = policy_loss + vf_loss_coeff * vf_loss - entropy_coeff * mean_entropy
    return {"total_loss": total, "policy_loss": policy_loss, "vf_loss": vf_loss, "entropy": mean_entropy}


def value_and_entropy(values, vs, entropy, valid) -> tuple[torch.Tensor, torch.Tensor]:
    """``0.5 * mean((V - vs)^2)`` and ``mean(H)`` over the valid steps."""
    return 0.5 * masked_mean((values - vs).pow(2), valid), masked_mean(entropy, valid)


def policy_advantages(vt: VTraceReturns, u: Unroll, config: VTraceKeys) -> torch.Tensor:
    """The advantages the policy gradient weighs: V-trace's, standardized with ``normalize_advantages``."""
    return standardize(vt.pg_advantages, u.valid) if config.normalize_advantages else vt.pg_advantages


def impala_loss(module, batch: dict, learner: Learner, config: IMPALAConfig) -> tuple[torch.Tensor, dict]:
    u = unroll(module, batch, config.fragment_length(), config.gamma)
    vt = vtrace_for(u, u.logp, config)
    terms = impala_loss_terms(u.logp, u.entropy, u.values, vt.vs, policy_advantages(vt, u, config), u.valid,
                              vf_loss_coeff=config.vf_loss_coeff, entropy_coeff=config.entropy_coeff)
    loss = terms.pop("total_loss")
    stats = {k: v.detach() for k, v in terms.items()}
    stats["mean_rho"] = masked_mean(vt.rhos, u.valid)
    return loss, stats


# ---- the learner and its thread (shared with APPO) ---------------------------------------------
def make_learner_thread(learner: Learner, config):
    """A LearnerThread, or the multi-device one when the config names several devices or a GPU."""
    devices = config.learner_devices()
    if config.multi_device():
        from shoal.learn.multi_device import MultiDeviceLearnerThread

        return MultiDeviceLearnerThread(
            learner, devices, num_multi_gpu_tower_stacks=config.num_multi_gpu_tower_stacks,
            num_data_load_threads=config.num_data_load_threads, num_sgd_iter=config.num_sgd_iter,
            learner_queue_size=config.learner_queue_size, learner_queue_timeout=config.learner_queue_timeout,
            rows_per_unit=config.fragment_length())
    from shoal.learn.learner_thread import LearnerThread

    return LearnerThread(learner, learner_queue_size=config.learner_queue_size,
                         minibatch_buffer_size=config.minibatch_buffer_size, num_sgd_iter=config.num_sgd_iter,
                         learner_queue_timeout=config.learner_queue_timeout)


def make_async_learner(algo: Algorithm, loss_fn) -> Learner:
    """The actor-critic Learner on the first learner device (``loss_fn(module, batch, learner)``)."""
    cfg = algo.config
    if not cfg.fake_devices:
        resolve_device(cfg.resources.num_gpus)  # a clear ConfigError when GPUs are asked for but absent
    module = build_actor_critic(algo.env_info.observation_space, algo.env_info.action_space, cfg.model)
    return Learner(module, loss_fn, lr=cfg.lr, grad_clip=cfg.grad_clip, lr_schedule=cfg.lr_schedule,
                   max_nonfinite_updates=cfg.max_nonfinite_updates, device=cfg.learner_devices()[0])


def make_sequence_runners(algo: Algorithm):
    """Rollout actors that return time-major sequences, with requests kept in flight."""
    cfg = algo.config
    return algo.make_env_runners(ActorCriticPolicy, sequence_postprocess, cfg.fragment_length(),
                                 max_in_flight=cfg.max_requests_in_flight_per_worker)


# ---- algorithm --------------------------------------------------------------------------
class IMPALA(Algorithm):
    config_cls = IMPALAConfig

    def setup(self) -> None:
        self.policy_cls = ActorCriticPolicy
        self.learner = make_async_learner(self, functools.partial(impala_loss, config=self.config))
        self.thread = make_learner_thread(self.learner, self.config)
        self.env_runners = make_sequence_runners(self)
        self.pipeline = AsyncPipeline.from_config(self.env_runners, self.thread, self.config)
        self.broadcast_weights()

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
            for result in p.drain(wait=not ready):
                self.counters["env_steps_trained"] += result.env_steps
        with self.timers.time(Phase.SYNC):
            if p.broadcast_due():
                p.broadcast_done()
                self.broadcast_weights()
        p.check()
        return p.metrics()

    def train(self) -> dict[str, Any]:
        return {**super().train(), **self.thread.stats()}

    def get_state(self) -> dict[str, Any]:
        with self.thread.hold():
            return {**super().get_state(), "learner": self.learner.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        with self.thread.hold():
            self.learner.set_state(state["learner"])
        self.broadcast_weights()

    def stop(self) -> None:
        self.thread.stop()
        super().stop()
