"""PolicyLearner: one policy's training unit, the same wherever a policy learns.

A :class:`~shoal.learn.Learner` with the algorithm's loss record, plus what some losses need
beside the network: a target network (APPO), refreshed by the learner's post-update hook, and
an adaptive KL coefficient whose declared ``after_update`` phase moves it once per learner
result. The multi-agent form builds one per learning policy and the league one per learner
shard slot; both add only how their batches arrive (GAE in the learner, a replay actor).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Mapping, Optional

import numpy as np
import torch

from shoal.batch import Batch
from shoal.learn.behaviour_average import BehaviourAverage
from shoal.learn.learner import Learner
from shoal.learn.learner_params import LearnerParams
from shoal.learn.losses import LossRecord
from shoal.learn.target import AdaptiveKL, TargetNetwork, Unit

MakeLoss = Callable[..., Any]  # (config, *, target=..., kl=...) -> a loss record


class PolicyLearner:
    """``make_loss(config, target=, kl=)`` builds the loss record; ``learner_params`` (by default
    :meth:`LearnerParams.from_config <shoal.learn.learner_params.LearnerParams.from_config>` of
    ``config``) is every learner-level value (lr and its schedule, clip, entropy schedule,
    non-finite limit, KL penalty): nothing else of the config is read here. ``target_period``
    (learner updates) adds a target network refreshed that often; the KL coefficient is on when
    ``learner_params.use_kl_loss`` is. ``learner_cls`` (with ``learner_kwargs``) is the Learner kind,
    e.g. DD-PPO's all-reducing :class:`~shoal.learn.distributed.DistributedLearner`."""

    def __init__(
        self,
        module: torch.nn.Module,
        config,
        make_loss: MakeLoss,
        *,
        device: Any = "cpu",
        target_period: Optional[int] = None,
        learner_cls: type[Learner] = Learner,
        learner_params: Optional[LearnerParams] = None,
        **learner_kwargs: Any,
    ) -> None:
        self.config = config  # what the loss record is built from (and the algorithm reads back)
        params = LearnerParams.from_config(config) if learner_params is None else learner_params
        self.learner_params = params
        self.kl = AdaptiveKL(params.kl_coeff, params.kl_target, enabled=params.use_kl_loss)
        module = module.to(device)  # on its device before the target copies it
        self.target: Optional[TargetNetwork] = None
        if target_period is not None:
            self.target = TargetNetwork(module, target_period, unit="updates")
        # an average of the policy's parameters, moved after every update,
        self.average: Optional[TargetNetwork] = None
        if params.average_tau is not None:
            self.average = TargetNetwork(module, 1, unit="updates", tau=params.average_tau)
        # or a copy of the network trained on the policy's own actions after each update
        self.behaviour: Optional[BehaviourAverage] = None
        if params.behaviour_average is not None:
            b = params.behaviour_average
            self.behaviour = BehaviourAverage(
                module, window=b.window, sgd_steps=b.sgd_steps, batch_size=b.batch_size, lr=b.lr, seed=b.seed
            )
        objects: dict[str, Any] = {"target": self.target, "kl": self.kl}
        if params.magnet_coeff > 0:  # the loss pulls towards whichever average is kept
            objects["magnet"] = self.average if self.average is not None else self.behaviour
        self.learner = learner_cls(
            module, make_loss(config, **objects), device=device, **params.learner_kwargs(), **learner_kwargs
        )
        # KL(target || policy) measured by the loss at each update that completes a target period:
        # appended by the learning thread, consumed by ``after_update``
        self._period_kls: deque[float] = deque()
        self.period_kl: Optional[float] = None  # their mean over the latest result that had any
        if self.target is not None:  # refreshed right after the optimizer step that reaches the period
            if self.kl.enabled:  # runs first: reads the period's last KL before the refresh
                self.learner.add_post_update_hook(self._record_period_kl)
            self.learner.add_post_update_hook(self.target.post_update)
        if self.average is not None:
            self.learner.add_post_update_hook(self.average.post_update)

    def update(
        self, batch: Batch, num_epochs: int, minibatch_size: int, rng: np.random.Generator, *, sequence_length: int = 1
    ) -> dict[str, Any]:
        """Learn on ``batch`` (``num_epochs`` passes), then the after-update phase; the stats."""
        stats = self.learner.update(batch, num_epochs, minibatch_size, rng, sequence_length=sequence_length)
        self.after_update(stats)
        if self.behaviour is not None:
            self.behaviour.add(batch)
            loss = self.behaviour.train()
            if loss is not None:
                stats["average_nll"] = loss
        return stats

    def _record_period_kl(self, rows: int) -> None:
        """Post-update hook, before the target's: when this update completes a target period, keep
        the KL between the target and the policy that its loss measured (the policy's movement
        over the period's updates before this one)."""
        target = self.target
        assert target is not None
        if target.since_update + 1 >= target.period:
            kl = self.learner.last_stats.get("kl")
            if kl is not None:
                self._period_kls.append(float(kl))

    def after_update(self, stats: dict[str, Any]) -> None:
        """The post-update phase, once per learner result: the KL coefficient moves towards its target.

        Without a target network (PPO) the result's mean KL between the sampling policy and the
        updated one drives it. With one (APPO, AlphaStar) the loss measures the KL against the
        target, which is 0 right after each refresh, so a result's mean KL says little about
        the step size; the coefficient moves once per target refresh instead, on the KL the last
        update of the period measured (the span the penalty is meant to hold near ``kl_target``),
        reported as ``period_kl``. A config without the penalty's keys reports no coefficient."""
        if self.kl.enabled and self.target is None and "kl" in stats:
            self.kl.update(stats["kl"])
        elif self.kl.enabled:
            kls = [self._period_kls.popleft() for _ in range(len(self._period_kls))]
            for kl in kls:
                self.kl.update(kl)
            if kls:
                self.period_kl = float(np.mean(kls))
                stats["period_kl"] = self.period_kl
        if self.learner_params.kl_penalty_keys:  # a loss without the penalty (DQN, SAC, IMPALA) has no coefficient
            stats["kl_coeff"] = self.kl.coeff

    def kl_stats(self) -> dict[str, float]:
        """``kl_coeff``, and with a target network and the penalty on, the latest ``period_kl``."""
        out = {"kl_coeff": self.kl.coeff}
        if self.period_kl is not None:
            out["period_kl"] = self.period_kl
        return out

    def apply_config(self, config, *, set_lr: bool = True) -> None:
        """A changed config (``update_config``): a rebuilt loss record (one attribute store, so a
        learner thread never sees a half-changed loss) and learner record, the optimizer's clip,
        its lr when ``set_lr`` (and no lr_schedule decides it), the KL target."""
        self.config = config
        self.learner_params = params = LearnerParams.from_config(config)
        loss = self.learner.loss_fn
        assert isinstance(loss, LossRecord), "a PolicyLearner's loss is a loss record"
        self.learner.loss_fn = loss.with_config(config)
        self.learner.set_env_steps(self.learner.env_steps)  # scheduled loss fields keep their schedule
        self.learner.grad_clip = params.grad_clip
        if set_lr and not params.lr_schedule:
            self.learner.set_lr(params.lr)
        self.kl.target = params.kl_target

    def add_target(
        self, online: str, net: str, period: int, *, unit: Unit = "updates", tau: float = 1.0
    ) -> TargetNetwork:
        """A target network kept inside the learner's module (submodule ``net``, saved with it) for
        its submodule ``online``, refreshed every ``period`` updates or trained env steps (copied,
        or blended by ``tau``) right after the optimizer step that reaches it: the Q networks',
        SAC's and TD3's targets, which their losses read from the module itself."""
        module = self.learner.module
        self.target = TargetNetwork(
            module.get_submodule(online), period, unit=unit, tau=tau, net=module.get_submodule(net)
        )
        self.learner.add_post_update_hook(self.target.post_update)
        return self.target

    # ---- weights and state ------------------------------------------------------------------
    def get_weights(self) -> dict[str, np.ndarray]:
        return self.learner.get_weights()

    def set_weights(self, weights: dict) -> None:
        self.learner.set_weights(weights)
        for net in (self.target, self.average):
            if net is not None:
                net.sync()

    def average_weights(self) -> Optional[dict[str, np.ndarray]]:
        """The policy's average (``average_policy``) as weights; None when none is kept."""
        if self.behaviour is not None:
            return self.behaviour.weights()
        if self.average is None:
            return None
        return {k: v.detach().cpu().numpy() for k, v in self.average.net.state_dict().items()}

    def get_state(self) -> dict[str, Any]:
        """The module with its optimizer (Adam moments), update count, target network and KL coefficient."""
        state = {"learner": self.learner.get_state(), "kl": self.kl.get_state()}
        if self.target is not None:
            state["target"] = self.target.get_state()
        if self.average is not None:
            state["average"] = self.average.get_state()
        if self.behaviour is not None:
            state["behaviour_average"] = self.behaviour.get_state()
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.learner.set_state(state["learner"])
        if "kl" in state:  # IMPALA's checkpoints have none
            self.kl.set_state(state["kl"])
        if self.target is not None and "target" in state:
            self.target.set_state(state["target"])
        if self.average is not None and "average" in state:
            self.average.set_state(state["average"])
        elif self.average is not None:  # saved without an average: it starts at the restored policy
            self.average.sync()
        if self.behaviour is not None and "behaviour_average" in state:
            self.behaviour.set_state(state["behaviour_average"])
