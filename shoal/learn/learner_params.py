"""LearnerParams: the learner-level config values of one policy, as a frozen record.

Built like the loss records (:mod:`shoal.learn.losses`): :meth:`LearnerParams.from_config` reads
every learner-level key of a config once (the learning rate and its schedule, the gradient
clip, the entropy schedule, the non-finite update limit, the adaptive KL penalty's keys), and
a :class:`~shoal.learn.policy_learner.PolicyLearner` reads the record, never the config. A
config change (``Algorithm.update_config``) builds a new record from the changed config.

The keys a config may have are declared here as protocols: :class:`LearnerConfig` every
config's (:class:`~shoal.config.AlgorithmConfig`'s), :class:`KLPenaltyConfig` and
:class:`EntropyScheduleConfig` and :class:`PolicyAverageConfig` those of the configs with an adaptive KL
penalty, an entropy bonus on a schedule or a parameter average. A config without the optional keys gets the record's defaults (no KL
penalty, no entropy schedule).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional, Protocol, runtime_checkable

Schedule = tuple[tuple[int, float], ...]  # piecewise-linear ((env_steps, value), ...) points


@runtime_checkable
class LearnerConfig(Protocol):
    """The learner keys of every config (:class:`~shoal.config.AlgorithmConfig`)."""

    @property
    def lr(self) -> float: ...

    @property
    def lr_schedule(self) -> Optional[Sequence[tuple[int, float]]]: ...

    @property
    def grad_clip(self) -> Optional[float]: ...

    @property
    def max_nonfinite_updates(self) -> int: ...


@runtime_checkable
class KLPenaltyConfig(Protocol):
    """An adaptive KL penalty's keys (PPO, APPO, AlphaStar: ``KLPenaltyKeys``)."""

    @property
    def use_kl_loss(self) -> bool: ...

    @property
    def kl_coeff(self) -> float: ...

    @property
    def kl_target(self) -> float: ...


@runtime_checkable
class EntropyScheduleConfig(Protocol):
    """An entropy bonus on a schedule (PPO's and V-trace's loss keys)."""

    @property
    def entropy_coeff_schedule(self) -> Optional[Sequence[tuple[int, float]]]: ...


@runtime_checkable
class PolicyAverageConfig(Protocol):
    """A policy average's keys and its magnet's (AlphaStar: ``PolicyAverageKeys``)."""

    @property
    def average_policy(self) -> Optional[str]: ...

    @property
    def average_tau(self) -> float: ...

    @property
    def average_window(self) -> int: ...

    @property
    def average_sgd_steps(self) -> int: ...

    @property
    def average_batch_size(self) -> int: ...

    @property
    def average_lr(self) -> float: ...

    @property
    def seed(self) -> Optional[int]: ...

    @property
    def magnet_coeff(self) -> float: ...


def _schedule(points: Optional[Sequence[tuple[int, float]]]) -> Optional[Schedule]:
    """A config's schedule as a tuple of ``(env_steps, value)`` pairs; None when it has none."""
    return tuple((x, y) for x, y in points) if points else None


@dataclass(frozen=True)
class BehaviourAverageParams:
    """A behaviour average's settings (:class:`~shoal.learn.behaviour_average.BehaviourAverage`)."""

    window: int
    sgd_steps: int
    batch_size: int
    lr: float
    seed: Optional[int] = None  # its minibatch draws


@dataclass(frozen=True)
class LearnerParams:
    """What a policy's learner takes from its config: :class:`~shoal.learn.Learner`'s optimizer
    settings and the adaptive KL coefficient's (off, with ``kl_coeff`` 0, for a config without
    the penalty's keys)."""

    lr: float
    lr_schedule: Optional[Schedule] = None
    grad_clip: Optional[float] = None
    max_nonfinite_updates: int = 20
    entropy_coeff_schedule: Optional[Schedule] = None
    use_kl_loss: bool = False
    kl_coeff: float = 0.0
    kl_target: float = 0.01
    kl_penalty_keys: bool = False  # the config has the penalty's keys: results report the coefficient
    average_tau: Optional[float] = None  # the learner keeps an average of its parameters, moved by this per update
    magnet_coeff: float = 0.0  # the loss's pull towards the average kept (either kind)
    behaviour_average: Optional[BehaviourAverageParams] = None  # or a network trained on the policy's own actions

    @classmethod
    def config_values(cls, cfg: LearnerConfig) -> dict[str, Any]:
        """The fields ``cfg`` sets, by field name (the optional groups' only where it has them)."""
        values: dict[str, Any] = {
            "lr": float(cfg.lr),
            "lr_schedule": _schedule(cfg.lr_schedule),
            "grad_clip": None if cfg.grad_clip is None else float(cfg.grad_clip),
            "max_nonfinite_updates": int(cfg.max_nonfinite_updates),
        }
        if isinstance(cfg, EntropyScheduleConfig):
            values["entropy_coeff_schedule"] = _schedule(cfg.entropy_coeff_schedule)
        if isinstance(cfg, KLPenaltyConfig):
            values.update(
                use_kl_loss=bool(cfg.use_kl_loss),
                kl_coeff=float(cfg.kl_coeff),
                kl_target=float(cfg.kl_target),
                kl_penalty_keys=True,
            )
        if isinstance(cfg, PolicyAverageConfig):
            kind = cfg.average_policy
            values.update(
                average_tau=float(cfg.average_tau) if kind == "parameters" else None,
                magnet_coeff=float(cfg.magnet_coeff),
                behaviour_average=BehaviourAverageParams(
                    int(cfg.average_window),
                    int(cfg.average_sgd_steps),
                    int(cfg.average_batch_size),
                    float(cfg.average_lr),
                    cfg.seed,
                )
                if kind == "behaviour"
                else None,
            )
        return values

    @classmethod
    def from_config(cls, cfg: LearnerConfig) -> LearnerParams:
        """The record of ``cfg``'s learner keys."""
        return cls(**cls.config_values(cfg))

    def learner_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of :class:`~shoal.learn.Learner` this record sets."""
        return {
            "lr": self.lr,
            "grad_clip": self.grad_clip,
            "lr_schedule": list(self.lr_schedule) if self.lr_schedule else None,
            "loss_schedules": {"entropy_coeff": self.entropy_coeff_schedule},
            "max_nonfinite_updates": self.max_nonfinite_updates,
        }
