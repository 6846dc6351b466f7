"""APPO: IMPALA's asynchronous machinery with a PPO-style clipped surrogate and a target network.

Reads in order: config, loss, training_step. APPO reuses IMPALA's functions (sequences,
learner thread, train-batch assembly, broadcasts), not its class.

The design, kept simple:

- The target network is a frozen copy of the learner's network, refreshed every
  ``target_update_frequency`` learner updates. It plays PPO's "old policy": V-trace is
  computed with it as the target policy (``rho = pi_target / mu``, mu the behaviour policy
  that sampled), so the advantages estimate how good an action is for the target policy.
- The surrogate ratio is ``r = pi / pi_target`` (current vs target network), clipped to
  ``[1 - clip_param, 1 + clip_param]``: ``policy_loss = -mean(min(r A, clip(r) A))``.
  (mu's mismatch is already corrected by V-trace's clipped pg-rho in A.)
- Values come from the current network and regress onto the V-trace targets.
- Optional KL term ``kl_coeff * KL(pi_target || pi)``, its coefficient adapted towards
  ``kl_target`` like PPO's.

The refresh happens inside the loss, i.e. in the learner thread between two updates, so it
never races with an update; a device replica of the multi-device learner gets its own copy
of the target network, re-synced whenever the master copy changes.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

import numpy as np
import torch
from pydantic import Field

from shoal.algorithms.base import Algorithm
from shoal.algorithms.impala import (IMPALAConfig, async_state, async_training_step, masked_mean, set_async_state,
                                     setup_async, time_major, unroll, value_and_entropy, vtrace_for)
from shoal.algorithms.ppo import update_kl_coeff
from shoal.batch import Col
from shoal.learn import Learner


# ---- config -----------------------------------------------------------------------------
class APPOConfig(IMPALAConfig):
    algo = "appo"

    clip_param: float = Field(0.4, gt=0, description="Clip of the ratio pi / pi_target in the surrogate.")
    target_update_frequency: int = Field(4, ge=1, description="Learner updates between target-network refreshes.")
    use_kl_loss: bool = Field(False, description="Add kl_coeff * KL(pi_target || pi), the coefficient adapted to kl_target.")
    kl_coeff: float = Field(1.0, ge=0, description="Initial KL coefficient.")
    kl_target: float = Field(0.01, gt=0)


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


class TargetNetwork:
    """A frozen copy of ``learner.module``, refreshed every ``update_frequency`` of its updates.

    ``for_module(module)`` refreshes if due and returns the copy that sits beside ``module``:
    the master copy for the learner's own module, a per-replica copy (same weights) for the
    device replicas of a multi-device learner.
    """

    def __init__(self, learner: Learner, update_frequency: int) -> None:
        self.learner = learner
        self.update_frequency = update_frequency
        self.net = copy.deepcopy(learner.module).requires_grad_(False)
        self.updated_at = 0  # learner.num_updates at the last refresh
        self.version = 0
        self._replicas: dict[int, tuple[torch.nn.Module, int]] = {}
        self._lock = threading.Lock()

    def for_module(self, module: torch.nn.Module) -> torch.nn.Module:
        with self._lock:
            if self.learner.num_updates - self.updated_at >= self.update_frequency:
                self.net.load_state_dict(self.learner.module.state_dict())
                self.updated_at = self.learner.num_updates
                self.version += 1
            if module is self.learner.module:
                return self.net
            replica, version = self._replicas.get(id(module), (None, -1))
            if replica is None:
                replica = copy.deepcopy(self.net).to(next(module.parameters()).device)
            if version != self.version:
                replica.load_state_dict(self.net.state_dict())
            self._replicas[id(module)] = (replica, self.version)
            return replica

    def get_state(self) -> dict[str, Any]:
        return {"module": {k: v.detach().cpu().clone() for k, v in self.net.state_dict().items()},
                "updated_at": self.updated_at}

    def set_state(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.net.load_state_dict(state["module"])
            self.updated_at = int(state["updated_at"])
            self.version += 1


def appo_loss(module, batch: dict, learner: Learner, config: APPOConfig, target: TargetNetwork) -> tuple[torch.Tensor, dict]:
    T = config.fragment_length()
    u = unroll(module, batch, T, config.gamma)
    with torch.no_grad():
        target_inputs, _ = target.for_module(module)(batch[Col.OBS])
        target_dist = module.dist_cls(target_inputs)
        target_logp = time_major(target_dist.logp(batch[Col.ACTIONS]), T)
    vt = vtrace_for(u, target_logp, config)
    kl = time_major(target_dist.kl(u.dist), T) if config.use_kl_loss else None
    terms = appo_loss_terms(u.logp, target_logp, vt.pg_advantages, u.values, vt.vs, u.entropy, u.valid, kl,
                            clip_param=config.clip_param, vf_loss_coeff=config.vf_loss_coeff,
                            entropy_coeff=config.entropy_coeff, kl_coeff=learner.extra_state.get("kl_coeff", 0.0))
    loss = terms.pop("total_loss")
    stats = {k: v.detach() for k, v in terms.items()}
    stats["mean_rho"] = masked_mean(vt.rhos, u.valid)
    return loss, stats


# ---- algorithm --------------------------------------------------------------------------
class APPO(Algorithm):
    config_cls = APPOConfig

    def setup(self) -> None:
        setup_async(self, self._loss)  # the loss reads self.target, made next (it needs the learner)
        self.learner.extra_state["kl_coeff"] = self.config.kl_coeff if self.config.use_kl_loss else 0.0
        self.target = TargetNetwork(self.learner, self.config.target_update_frequency)

    def _loss(self, module, batch: dict, learner: Learner, config: APPOConfig):
        return appo_loss(module, batch, learner, config, self.target)

    def get_weights(self) -> dict[str, np.ndarray]:
        return self.thread.get_weights()

    def training_step(self) -> dict[str, Any]:
        metrics = async_training_step(self, on_learner_result=self._adapt_kl_coeff)
        metrics["learner/kl_coeff"] = self.learner.extra_state["kl_coeff"]
        return metrics

    def _adapt_kl_coeff(self, info: dict[str, float]) -> None:
        """Post-update, once per learner result: move the KL coefficient towards ``kl_target``."""
        if self.config.use_kl_loss and "kl" in info:
            extra = self.learner.extra_state  # read by the learner thread; one float assignment
            extra["kl_coeff"] = update_kl_coeff(extra["kl_coeff"], info["kl"], self.config.kl_target)

    def train(self) -> dict[str, Any]:
        return {**super().train(), **self.thread.stats()}

    def get_state(self) -> dict[str, Any]:
        with self.thread.lock:
            return {**super().get_state(), **async_state(self), "target": self.target.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        with self.thread.lock:
            self.target.set_state(state["target"])
        set_async_state(self, state)

    def stop(self) -> None:
        self.thread.stop()
        super().stop()
