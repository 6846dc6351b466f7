"""PolicyLearner: one policy's training unit, the same wherever a policy learns.

A :class:`~shoal.learn.Learner` with the algorithm's loss record, plus what some losses need
beside the network: a target network (APPO), refreshed by the learner's post-update hook, and
an adaptive KL coefficient whose declared ``after_update`` phase moves it once per learner
result. The multi-agent form builds one per learning policy and the league one per learner
shard slot; both add only how their batches arrive (GAE in the learner, a replay actor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import numpy as np
import torch

from shoal.batch import Batch
from shoal.learn.learner import Learner
from shoal.learn.losses import LossRecord
from shoal.learn.target import AdaptiveKL, TargetNetwork

MakeLoss = Callable[..., Any]  # (config, *, target=..., kl=...) -> a loss record


@dataclass
class LearnerOutput:
    """What one learning step of a policy produced: its stats, the rows it learned from, and
    (for a learner in another process) the weights to broadcast."""

    stats: dict[str, Any]
    rows: int
    weights: Optional[dict[str, np.ndarray]] = None


class PolicyLearner:
    """``make_loss(config, target=, kl=)`` builds the loss record; ``target_period`` (learner
    updates) adds a target network refreshed that often; the KL coefficient is on when the
    config's ``use_kl_loss`` is. ``learner_cls`` (with ``learner_kwargs``) is the Learner kind,
    e.g. DD-PPO's all-reducing :class:`~shoal.learn.distributed.DistributedLearner`."""

    def __init__(self, module: torch.nn.Module, config, make_loss: MakeLoss, *, device: Any = "cpu",
                 target_period: Optional[int] = None, learner_cls: type[Learner] = Learner,
                 **learner_kwargs: Any) -> None:
        self.config = config
        self.kl = AdaptiveKL(getattr(config, "kl_coeff", 0.0), getattr(config, "kl_target", 0.01),
                             enabled=getattr(config, "use_kl_loss", False))
        module = module.to(device)  # on its device before the target copies it
        self.target: Optional[TargetNetwork] = None
        if target_period is not None:
            self.target = TargetNetwork(module, target_period, unit="updates")
        self.learner = learner_cls(module, make_loss(config, target=self.target, kl=self.kl), lr=config.lr,
                                   grad_clip=config.grad_clip, lr_schedule=config.lr_schedule,
                                   max_nonfinite_updates=config.max_nonfinite_updates, device=device, **learner_kwargs)
        if self.target is not None:  # refreshed right after the optimizer step that reaches the period
            self.learner.add_post_update_hook(self.target.post_update)
        self._refreshes_seen: Optional[int] = 0  # target refreshes when the KL coefficient last moved

    def update(self, batch: Batch, num_epochs: int, minibatch_size: int, rng: np.random.Generator, *,
               sequence_length: int = 1) -> dict[str, Any]:
        """Learn on ``batch`` (``num_epochs`` passes), then the after-update phase; the stats."""
        stats = self.learner.update(batch, num_epochs, minibatch_size, rng, sequence_length=sequence_length)
        self.after_update(stats)
        return stats

    def after_update(self, stats: dict[str, Any]) -> None:
        """The post-update phase, once per learner result: the KL coefficient moves towards its target.

        With a target network (APPO) the KL is measured against the target, so it only spans the
        updates since its last refresh and is small right after one. The coefficient then moves
        only in a result in which the target was refreshed: that result's KL spans the target's
        whole period, the step size the penalty is meant to hold near ``kl_target``."""
        if self.kl.enabled and "kl" in stats:
            refreshes = self.target.num_updates if self.target is not None else None
            if refreshes is None or refreshes != self._refreshes_seen:
                self.kl.update(stats["kl"])
                self._refreshes_seen = refreshes
        stats["kl_coeff"] = self.kl.coeff

    def apply_config(self, config, *, set_lr: bool = True) -> None:
        """A changed config (``update_config``): a rebuilt loss record (one attribute store, so a
        learner thread never sees a half-changed loss), the optimizer's clip, its lr when
        ``set_lr`` (and no lr_schedule decides it), the KL target."""
        self.config = config
        loss = self.learner.loss_fn
        assert isinstance(loss, LossRecord), "a PolicyLearner's loss is a loss record"
        self.learner.loss_fn = loss.with_config(config)
        self.learner.grad_clip = config.grad_clip
        if set_lr and not config.lr_schedule:
            self.learner.set_lr(config.lr)
        if hasattr(config, "kl_target"):
            self.kl.target = float(config.kl_target)

    # ---- weights and state ------------------------------------------------------------------
    def get_weights(self) -> dict[str, np.ndarray]:
        return self.learner.get_weights()

    def set_weights(self, weights: dict) -> None:
        self.learner.set_weights(weights)
        if self.target is not None:
            self.target.sync()

    def get_state(self) -> dict[str, Any]:
        """The module with its optimizer (Adam moments), update count, target network and KL coefficient."""
        state = {"learner": self.learner.get_state(), "kl": self.kl.get_state()}
        if self.target is not None:
            state["target"] = self.target.get_state()
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.learner.set_state(state["learner"])
        if "kl" in state:  # IMPALA's checkpoints have none
            self.kl.set_state(state["kl"])
        if self.target is not None and "target" in state:
            self.target.set_state(state["target"])
