"""Changing a running algorithm's config (``Algorithm.update_config``: Tune's PBT, ``shoal resume --set``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shoal.errors import ConfigError
from shoal.learn.losses import LossRecord

if TYPE_CHECKING:
    from shoal.framework.base import Algorithm


def apply_config_changes(algo: "Algorithm", changes: dict[str, Any]) -> None:
    """Check ``changes`` against the config's ``mutable_keys`` and its validators, set them on the
    running config in place (what config.yaml and Tune read), then hand the changed config to the
    policies' learners, or to a learner of the driver's own (``algo.learner``)."""
    config = algo.config
    allowed = type(config).mutable_keys
    bad = sorted(set(changes) - allowed)
    if bad:
        raise ConfigError(
            f"{config.algo} cannot change {', '.join(map(repr, bad))} mid-run (it shapes buffers, actors or the "
            f"network, or lives in another process); keys that can change: {', '.join(sorted(allowed)) or 'none'}."
        )
    if "lr" in changes and config.lr_schedule:
        raise ConfigError("lr cannot change mid-run while lr_schedule is set: the schedule decides the learning rate.")
    if "entropy_coeff" in changes and getattr(config, "entropy_coeff_schedule", None):
        raise ConfigError(
            "entropy_coeff cannot change mid-run while entropy_coeff_schedule is set: the schedule decides it."
        )
    checked = config.copy_with(dict(changes))  # validates the values (a ConfigError names a bad one)
    for key in changes:
        setattr(config, key, getattr(checked, key))
    if algo.policies is not None:
        algo.policies.apply_config(config, changes)
        return
    learner = getattr(algo, "learner", None)
    if learner is not None:
        if isinstance(learner.loss_fn, LossRecord):  # one attribute store: never a half-changed loss
            learner.loss_fn = learner.loss_fn.with_config(config)
        learner.grad_clip = config.grad_clip
        if "lr" in changes:
            learner.set_lr(config.lr)
