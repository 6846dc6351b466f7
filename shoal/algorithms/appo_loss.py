"""APPO's loss, shared by APPO (``appo.py``) and the league's policy learner (``alpha_star_learner.py``).

The clipped surrogate against the target network on V-trace advantages computed with the
target as V-trace's target policy (:func:`appo_loss_terms`, :class:`APPOLoss`); ``appo.py``'s
docstring describes the design.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

import torch

from shoal.batch import Col
from shoal.learn.behaviour_average import BehaviourAverage
from shoal.learn.learner_params import PolicyAverageConfig
from shoal.learn.losses import LossRecord
from shoal.learn.masking import ActionMasked
from shoal.learn.sequences import VTraceParams, policy_advantages, time_major, unroll, value_and_entropy, vtrace_for
from shoal.learn.stats import STANDARDIZE_SUMS, masked_mean
from shoal.learn.target import AdaptiveKL, TargetNetwork
from shoal.models.recurrent import run_sequences


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
    magnet_coeff: float = 0.0  # the pull towards the policy's average (AlphaStar's ``magnet_coeff``)
    magnet: Optional[TargetNetwork | BehaviourAverage] = dataclasses.field(default=None, compare=False)  # that average

    @classmethod
    def config_values(cls, cfg) -> dict[str, Any]:
        return {
            "magnet_coeff": cfg.magnet_coeff if isinstance(cfg, PolicyAverageConfig) else 0.0,
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

    @torch.no_grad()
    def _frozen_dist(self, module, batch: dict, net: TargetNetwork | BehaviourAverage):
        """The action distribution of ``net`` (the target network, or the magnet) over the batch: its
        copy beside ``module`` (per device on a multi-device learner), its logits under the batch's
        action masks as ``module``'s are, over whole sequences for a recurrent module."""
        copy: Any = net.for_module(module.module if Col.ACTION_MASK in batch else module)
        if Col.ACTION_MASK in batch:  # ``module`` is the masked view: the copy's logits get the same mask
            copy = ActionMasked(copy, batch[Col.ACTION_MASK])
        if getattr(module, "recurrent", False):
            inputs = run_sequences(copy, batch, self.seq_len)[0]
        else:
            inputs, _ = copy(batch[Col.OBS])
        return module.dist_cls(inputs)

    def _magnet_kl(self, module, batch: dict, u) -> Optional[torch.Tensor]:
        """KL(pi || magnet) per step, time-major, the magnet being the policy's average (its parameters' or
        its behaviour's); None without one."""
        if self.magnet is None or self.magnet_coeff <= 0:
            return None
        return time_major(u.dist.kl(self._frozen_dist(module, batch, self.magnet)), self.seq_len)

    def __call__(self, module, batch: dict, learner=None) -> tuple[torch.Tensor, dict]:
        if Col.ACTION_MASK in batch:
            module = ActionMasked(module, batch[Col.ACTION_MASK])
        T = self.seq_len
        u = unroll(module, batch, T, self.gamma)
        target_dist = self._frozen_dist(module, batch, self.target)
        with torch.no_grad():
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
        magnet_kl = self._magnet_kl(module, batch, u)
        if magnet_kl is not None:
            terms["magnet_kl"] = masked_mean(magnet_kl, u.valid)
            loss = loss + self.magnet_coeff * terms["magnet_kl"]
        stats = {k: v.detach() for k, v in terms.items()}
        stats["mean_rho"] = masked_mean(vt.rhos, u.valid)
        return loss, stats
