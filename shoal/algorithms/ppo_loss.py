"""PPO's loss and the batches it trains on, shared by PPO (``ppo.py``) and DD-PPO (``ddppo.py``).

The clipped surrogate on GAE advantages (:func:`ppo_loss_terms`, :class:`PPOLoss`), the
worker-side postprocessing that computes the advantages (:func:`gae_postprocess`, with the
training sequences of a recurrent policy), and how a batch is split and counted in SGD.

Value clipping (``vf_clip_param``) is the PPO2 / OpenAI-baselines form: the new value is
clipped to within ``vf_clip_param`` of the value predicted at sampling time, and the loss is
the elementwise maximum of the clipped and unclipped squared errors, times 0.5. It is off by
default (``None``): the study by Andrychowicz et al. (2021) found it does not help.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from shoal.batch import Batch, Col
from shoal.learn.losses import LossRecord
from shoal.learn.masking import ActionMasked
from shoal.learn.stats import masked_mean, standardize
from shoal.learn.target import AdaptiveKL
from shoal.models.recurrent import pack_state, run_sequences
from shoal.rollout import Fragment, compute_gae, flatten_valid
from shoal.rollout.postprocessing import env_major


def ppo_loss_terms(
    logp,
    old_logp,
    advantages,
    values,
    old_values,
    value_targets,
    entropy,
    kl=None,
    *,
    clip_param: float,
    vf_clip_param: float | None,
    vf_loss_coeff: float,
    entropy_coeff: float,
    kl_coeff: float = 0.0,
    valid: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """The PPO objective from per-sample tensors; ``total_loss`` is what gets minimised.
    Means run over the steps where ``valid`` is True (recurrent sequences keep their reset rows).

    policy_loss = -mean(min(r * A, clip(r, 1 - eps, 1 + eps) * A)),  r = exp(logp - old_logp)
    vf_loss     = 0.5 * mean((V - R)^2), or with clipping
                  0.5 * mean(max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2))
    total_loss  = policy_loss + vf_loss_coeff * vf_loss - entropy_coeff * mean(H) + kl_coeff * mean(KL)

    ``kl`` is the exact KL(old || new) per sample; when None (no KL penalty) the reported
    ``kl`` is the low-variance estimate mean((r - 1) - log r).
    """
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    surr = torch.min(ratio * advantages, ratio.clamp(1 - clip_param, 1 + clip_param) * advantages)
    policy_loss = -masked_mean(surr, valid)
    vf_err = (values - value_targets).pow(2)
    if vf_clip_param is not None:
        clipped = old_values + (values - old_values).clamp(-vf_clip_param, vf_clip_param)
        vf_err = torch.max(vf_err, (clipped - value_targets).pow(2))
    vf_loss = 0.5 * masked_mean(vf_err, valid)
    mean_entropy = masked_mean(entropy, valid)
    total = policy_loss + vf_loss_coeff * vf_loss - entropy_coeff * mean_entropy
    if kl is not None:
        mean_kl = masked_mean(kl, valid)
        total = total + kl_coeff * mean_kl
    else:
        mean_kl = masked_mean((ratio - 1) - log_ratio, valid).detach()
    return {
        "total_loss": total,
        "policy_loss": policy_loss,
        "vf_loss": vf_loss,
        "entropy": mean_entropy,
        "kl": mean_kl,
        "clip_fraction": masked_mean(((ratio - 1).abs() > clip_param).float(), valid),
    }


@dataclass(frozen=True)
class PPOLoss(LossRecord):
    """PPO's loss (:func:`ppo_loss_terms`) from the keys it reads; a Learner's ``loss_fn``.

    ``kl``: the adaptive KL penalty's coefficient, when ``use_kl_loss`` is on. A batch with
    ``ACTION_MASK`` (an env or game with action masks) has the logits masked by it."""

    clip_param: float
    vf_clip_param: Optional[float]
    vf_loss_coeff: float
    entropy_coeff: float
    normalize_advantages: bool
    max_seq_len: int  # rows per training sequence of a recurrent model
    kl: Optional[AdaptiveKL] = dataclasses.field(default=None, compare=False)

    @classmethod
    def config_values(cls, cfg) -> dict[str, Any]:
        return {
            "clip_param": cfg.clip_param,
            "vf_clip_param": cfg.vf_clip_param,
            "vf_loss_coeff": cfg.vf_loss_coeff,
            "entropy_coeff": cfg.entropy_coeff,
            "normalize_advantages": cfg.normalize_advantages,
            "max_seq_len": cfg.model.max_seq_len,
        }

    def __call__(self, module, batch: dict, learner=None) -> tuple[torch.Tensor, dict]:
        if Col.ACTION_MASK in batch:
            module = ActionMasked(module, batch[Col.ACTION_MASK])
        valid = batch.get(Col.VALID)  # sequences keep their reset rows (recurrent, multi-agent): mask them
        if getattr(module, "recurrent", False):  # whole sequences, from the state recorded at each one's start
            inputs, values, _ = run_sequences(module, batch, self.max_seq_len)
        else:
            inputs, values = module(batch[Col.OBS])
        dist = module.dist_cls(inputs)
        adv = batch[Col.ADVANTAGES]
        if self.normalize_advantages:
            adv = standardize(adv, valid)
        kl = self.kl if self.kl is not None and self.kl.enabled else None
        kl_old_new = module.dist_cls(batch[Col.ACTION_DIST_INPUTS]).kl(dist) if kl is not None else None
        terms = ppo_loss_terms(
            dist.logp(batch[Col.ACTIONS]),
            batch[Col.ACTION_LOGP],
            adv,
            values,
            batch[Col.VF_PREDS],
            batch[Col.VALUE_TARGETS],
            dist.entropy(),
            kl_old_new,
            clip_param=self.clip_param,
            vf_clip_param=self.vf_clip_param,
            vf_loss_coeff=self.vf_loss_coeff,
            entropy_coeff=self.entropy_coeff,
            kl_coeff=kl.coeff if kl is not None else 0.0,
            valid=valid,
        )
        loss = terms.pop("total_loss")
        return loss, {k: v.detach() for k, v in terms.items()}


def gae_postprocess(fragment: Fragment, gamma: float, gae_lambda: float) -> Batch:
    """Worker-side: advantages and value targets, then the valid steps flattened; for a recurrent
    policy every step instead, as sequences with their start states (:func:`sequence_rows`)."""
    values = fragment.extras[Col.VF_PREDS]
    next_values = np.concatenate([values[1:], fragment.last_extras[Col.VF_PREDS][None]], axis=0)
    dones = fragment.terminateds | fragment.truncateds
    adv = compute_gae(fragment.rewards, values, next_values, fragment.terminateds, dones, gamma, gae_lambda)
    cols = {
        Col.OBS: fragment.obs[:-1],
        Col.ACTIONS: fragment.actions,
        Col.ACTION_LOGP: fragment.extras[Col.ACTION_LOGP],
        Col.ACTION_DIST_INPUTS: fragment.extras[Col.ACTION_DIST_INPUTS],
        Col.VF_PREDS: values,
        Col.ADVANTAGES: adv,
        Col.VALUE_TARGETS: adv + values,
    }
    if fragment.masks is not None:
        cols[Col.ACTION_MASK] = fragment.masks[:-1]
    if fragment.state_in is not None:
        return sequence_rows(cols, fragment)
    return Batch(flatten_valid(cols, fragment.valid))


def sequence_rows(cols: dict[str, np.ndarray], fragment: Fragment) -> Batch:
    """Time-major ``(T, N, ...)`` columns as rows of training sequences: each env's T steps in order
    (``VALID`` marks the reset rows), so each run of ``L = T // len(state_in)`` rows is one
    sequence, and ``STATE_IN`` holds the state recorded at its start."""
    assert fragment.state_in is not None, "a recurrent policy's fragment records its states"
    T, n_seq = len(fragment.rewards), len(fragment.state_in)
    rows = {k: env_major(v) for k, v in cols.items()}
    rows[Col.VALID] = env_major(fragment.valid)
    rows[Col.TERMINATEDS] = env_major(fragment.terminateds)  # where the learner zeroes the state, as the runner did
    states = np.swapaxes(fragment.state_in, 0, 1)  # (N, T // L, size): env after env, sequences in order
    rows[Col.STATE_IN] = pack_state(states.reshape(-1, states.shape[-1]), T // n_seq)
    return Batch(rows)


def sgd_sequence_length(config) -> int:
    """Rows per minibatch unit: whole sequences for a recurrent model, single steps otherwise."""
    return config.model.max_seq_len if config.model.is_recurrent() else 1
