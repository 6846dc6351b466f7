"""The league's policy learner: one policy's APPO learner beside its shard's replay actor.

:class:`APPOPolicyLearner` runs on a learner shard (a Ray actor, or in the driver). Each
``learn()`` pulls up to ``train_batch_size`` rows (new and replayed batches) from the shard's
replay, runs ``num_sgd_iter`` passes of APPO's loss under the stored action masks, adapts the
KL coefficient once (the post-update phase, as APPO does per learner result) and returns the
stats with the new weights. The target network refreshes through the learner's post-update
hook, like APPO's.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Union

import numpy as np
import torch

from shoal.algorithms.appo import appo_loss, make_appo_target
from shoal.batch import Batch, Col
from shoal.errors import ActorLostError
from shoal.learn import Learner
from shoal.learn.distributed_learners import REPLAY_LOST, resolve_learner_device
from shoal.learn.masking import ActionMasked
from shoal.learn.target import AdaptiveKL, TargetNetwork
from shoal.models import build_actor_critic
from shoal.process import configure_process


class _MaskedTarget:
    """APPO's target network seen through the batch's action masks (its logits masked like the learner's)."""

    def __init__(self, target: TargetNetwork, mask: torch.Tensor) -> None:
        self.target, self.mask = target, mask

    def for_module(self, module: ActionMasked) -> ActionMasked:
        return ActionMasked(self.target.for_module(module.module), self.mask)


def masked_appo_loss(module, batch: dict, learner: Learner, config, target: TargetNetwork, kl: AdaptiveKL):
    """APPO's loss with the current and the target network's logits masked by ``ACTION_MASK``."""
    mask = batch[Col.ACTION_MASK]
    return appo_loss(ActionMasked(module, mask), batch, learner, config, _MaskedTarget(target, mask), kl)


class APPOPolicyLearner:
    """One policy's APPO learner on its shard's replay actor: ``learn()`` pulls up to
    ``train_batch_size`` rows (new plus replayed), runs ``num_sgd_iter`` updates and returns
    the stats and new weights, or None when nothing was waiting."""

    def __init__(self, policy_id: str, replay: Any, config, obs_space, action_space, idle_sleep_s: float = 0.0,
                 device: str = "cpu") -> None:
        configure_process(config.resources)
        self.policy_id, self.replay, self.config, self.idle_sleep_s = policy_id, replay, config, idle_sleep_s
        module = build_actor_critic(obs_space, action_space, config.model)
        self.kl = AdaptiveKL(config.kl_coeff, config.kl_target, enabled=config.use_kl_loss)
        self.learner = Learner(module, self._loss, lr=config.lr, grad_clip=config.grad_clip, lr_schedule=config.lr_schedule,
                               max_nonfinite_updates=config.max_nonfinite_updates, device=resolve_learner_device(device))
        self.target = make_appo_target(self.learner, config)
        self.rng = np.random.default_rng(None if config.seed is None else [config.seed, *policy_id.encode()])

    def _loss(self, module, batch: dict, learner: Learner):
        return masked_appo_loss(module, batch, learner, self.config, self.target, self.kl)

    def learn(self, env_steps: Optional[int] = None) -> Union[dict[str, Any], str, None]:
        """``env_steps``: the run's sampled env steps, which move ``lr_schedule`` along. Returns
        :data:`REPLAY_LOST` when the shard's replay actor died under it."""
        if env_steps is not None:
            self.learner.set_env_steps(env_steps)
        batches = self._pull()
        if batches is REPLAY_LOST or not batches:
            if not batches and self.idle_sleep_s:
                time.sleep(self.idle_sleep_s)
            return batches if batches is REPLAY_LOST else None
        cfg = self.config
        rows = sum(len(b) for b in batches)
        stats = self.learner.update(Batch.concat(batches), cfg.num_sgd_iter, cfg.minibatch_size or rows, self.rng,
                                    sequence_length=cfg.fragment_length())
        if cfg.use_kl_loss:  # the post-update phase: once per learner result, like APPO's
            self.kl.update(stats["kl"])
        stats.update(num_updates=self.learner.num_updates, num_nonfinite_skipped=self.learner.num_nonfinite_skipped,
                     kl_coeff=self.kl.coeff, device=str(self.learner.device))
        return {"rows": rows, "stats": stats, "weights": self.get_weights()}

    def _pull(self) -> Union[list[Batch], str]:
        """Batches from the shard's replay until a train batch's rows are in (or it has none left)."""
        batches, rows = [], 0
        while rows < self.config.train_batch_size:
            try:
                b = self.replay.replay(self.policy_id)
            except ActorLostError:  # the shard's replay actor died: the driver recreates it and calls set_replay
                return REPLAY_LOST
            if b is None:
                break
            batches.append(b)
            rows += len(b)
        return batches

    def set_replay(self, replay: Any) -> None:
        """The shard's replay actor was recreated: pull from the new one."""
        self.replay = replay

    def get_weights(self) -> dict[str, np.ndarray]:
        return self.learner.get_weights()

    def set_weights(self, weights: dict) -> None:
        self.learner.set_weights(weights)
        self.target.sync()

    def get_state(self) -> dict[str, Any]:
        """For checkpoints: the module with its optimizer (Adam moments), update count, target network and KL."""
        return {"learner": self.learner.get_state(), "target": self.target.get_state(), "kl": self.kl.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        self.learner.set_state(state["learner"])
        self.target.set_state(state["target"])
        self.kl.set_state(state["kl"])
