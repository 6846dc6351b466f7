"""Whole sequences through the current network, and V-trace over them (IMPALA, APPO, the league).

Rollout actors send time-major fragments as rows, one env's ``T`` steps after another
(:func:`shoal.rollout.postprocessing.sequence_postprocess`); :func:`unroll` runs the network
over them and views every column as ``(T, sequences)`` again, with the value of the
observation after each sequence as the bootstrap. :func:`vtrace_for` then computes V-trace
(:mod:`shoal.learn.vtrace` explains how reset rows, termination and truncation are handled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from shoal.batch import Col, unpack_per_sequence
from shoal.learn.stats import masked_mean, standardize
from shoal.learn.vtrace import VTraceReturns, vtrace
from shoal.models.recurrent import run_sequences


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
    last_next_obs = unpack_per_sequence(batch[Col.BOOTSTRAP_OBS], T, batch[Col.OBS].shape[1:])
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


@dataclass(frozen=True)
class VTraceParams:
    """V-trace's clips and lambda (the ``vtrace_*`` config keys)."""

    clip_rho_threshold: float | None = 1.0
    clip_pg_rho_threshold: float | None = 1.0
    lambda_: float = 1.0

    @classmethod
    def from_config(cls, config) -> "VTraceParams":
        return cls(config.vtrace_clip_rho_threshold, config.vtrace_clip_pg_rho_threshold, config.vtrace_lambda)


def vtrace_for(u: Unroll, target_logp: torch.Tensor, params: VTraceParams) -> VTraceReturns:
    """V-trace with ``target_logp`` as the target policy (the current network for IMPALA)."""
    return vtrace(
        target_logp.detach() - u.behaviour_logp,
        u.discounts,
        u.rewards,
        u.values.detach(),
        u.bootstrap.detach(),
        u.valid,
        clip_rho_threshold=params.clip_rho_threshold,
        clip_pg_rho_threshold=params.clip_pg_rho_threshold,
        lambda_=params.lambda_,
    )


def value_and_entropy(values, vs, entropy, valid) -> tuple[torch.Tensor, torch.Tensor]:
    """``0.5 * mean((V - vs)^2)`` and ``mean(H)`` over the valid steps."""
    return 0.5 * masked_mean((values - vs).pow(2), valid), masked_mean(entropy, valid)


def policy_advantages(vt: VTraceReturns, u: Unroll, normalize: bool, learner: Any = None) -> torch.Tensor:
    """The advantages the policy gradient weighs: V-trace's, standardized when ``normalize`` (over
    the learner group's union batch when ``learner`` is a group member's: its ``sum_over_group``)."""
    if not normalize:
        return vt.pg_advantages
    return standardize(vt.pg_advantages, u.valid, getattr(learner, "sum_over_group", None))
