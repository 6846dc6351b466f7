"""The learner-level config values as one frozen record (``LearnerParams``): built from each
algorithm's config with the values it holds, and what a PolicyLearner learns with."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from shoal import APPOConfig, DQNConfig, IMPALAConfig, PPOConfig, SACConfig
from shoal.batch import Batch
from shoal.config import AlgorithmConfig
from shoal.errors import ConfigError
from shoal.learn.learner_params import LearnerParams
from shoal.learn.losses import LossRecord
from shoal.learn.policy_learner import PolicyLearner

LR_SCHEDULE = [(0, 1e-3), (1000, 1e-4)]
ENTROPY_SCHEDULE = [(0, 0.01), (1000, 0.0)]
COMMON = {"lr": 2e-3, "grad_clip": 3.0, "max_nonfinite_updates": 7}
KL = {"use_kl_loss": True, "kl_coeff": 0.3, "kl_target": 0.02}

# each algorithm's config, with the learner keys it has set away from their defaults
CONFIGS = {
    "ppo": (PPOConfig, {**COMMON, **KL, "entropy_coeff_schedule": ENTROPY_SCHEDULE}),
    "impala": (IMPALAConfig, {**COMMON, "entropy_coeff_schedule": ENTROPY_SCHEDULE}),
    "appo": (APPOConfig, {**COMMON, **KL, "entropy_coeff_schedule": ENTROPY_SCHEDULE}),
    "dqn": (DQNConfig, COMMON),
    "sac": (SACConfig, COMMON),
}


@dataclass(frozen=True)
class SquareLoss(LossRecord):
    """A loss record with a schedulable ``entropy_coeff`` field, reading nothing from the config."""

    entropy_coeff: float = 0.0

    @classmethod
    def config_values(cls, cfg) -> dict[str, Any]:
        return {}

    def __call__(self, module, batch, learner=None):
        return module(batch["x"]).pow(2).mean(), {}


def make_config(name: str, **extra: Any) -> AlgorithmConfig:
    cls, keys = CONFIGS[name]
    env = "Pendulum-v1" if name == "sac" else "CartPole-v1"
    return cls(env=env, **keys, **extra)


def policy_learner(cfg, **kw: Any) -> PolicyLearner:
    return PolicyLearner(torch.nn.Linear(2, 1), cfg, lambda c, **_: SquareLoss(), **kw)


def test_the_record_is_frozen():
    params = LearnerParams.from_config(make_config("ppo"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.lr = 1.0  # type: ignore[misc]
    assert params == LearnerParams.from_config(make_config("ppo"))  # a plain value


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_built_from_each_algorithms_config_with_its_values(name):
    cfg = make_config(name, lr_schedule=LR_SCHEDULE)
    params = LearnerParams.from_config(cfg)
    assert (params.lr, params.grad_clip, params.max_nonfinite_updates) == (2e-3, 3.0, 7)
    assert params.lr_schedule == tuple(LR_SCHEDULE)
    has_entropy_schedule = "entropy_coeff_schedule" in CONFIGS[name][1]
    assert params.entropy_coeff_schedule == (tuple(ENTROPY_SCHEDULE) if has_entropy_schedule else None)
    if "use_kl_loss" in CONFIGS[name][1]:
        assert (params.use_kl_loss, params.kl_coeff, params.kl_target) == (True, 0.3, 0.02)
    else:  # no KL penalty keys: the penalty is off
        assert (params.use_kl_loss, params.kl_coeff, params.kl_target) == (False, 0.0, 0.01)
        assert not params.kl_penalty_keys


def test_a_configs_defaults_reach_the_record():
    params = LearnerParams.from_config(PPOConfig(env="CartPole-v1"))
    cfg = PPOConfig(env="CartPole-v1")
    assert params == LearnerParams(
        lr=cfg.lr,
        grad_clip=cfg.grad_clip,
        max_nonfinite_updates=cfg.max_nonfinite_updates,
        use_kl_loss=cfg.use_kl_loss,
        kl_coeff=cfg.kl_coeff,
        kl_target=cfg.kl_target,
        kl_penalty_keys=True,
    )
    assert not LearnerParams.from_config(SACConfig(env="Pendulum-v1")).kl_penalty_keys  # no coefficient to report
    assert LearnerParams.from_config(SACConfig(env="Pendulum-v1")).grad_clip is None  # SAC's own default


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_policy_learner_built_from_a_config_holds_its_values(name):
    cfg = make_config(name)
    pl = policy_learner(cfg)
    assert pl.learner_params == LearnerParams.from_config(cfg)
    learner = pl.learner
    assert (learner.lr, learner.grad_clip, learner.max_nonfinite_updates) == (2e-3, 3.0, 7)
    assert learner.optimizer.param_groups[0]["lr"] == 2e-3
    kl = CONFIGS[name][1].get("use_kl_loss", False)
    assert (pl.kl.enabled, pl.kl.coeff, pl.kl.target) == ((True, 0.3, 0.02) if kl else (False, 0.0, 0.01))
    assert set(learner.loss_schedules) == ({"entropy_coeff"} if "entropy_coeff_schedule" in CONFIGS[name][1] else set())


def test_an_lr_schedule_in_the_config_reaches_the_learner():
    pl = policy_learner(make_config("ppo", lr_schedule=LR_SCHEDULE))
    learner = pl.learner
    assert learner.lr == 1e-3
    learner.set_env_steps(500)
    assert learner.lr == pytest.approx(5.5e-4) == learner.optimizer.param_groups[0]["lr"]
    learner.set_env_steps(500)
    assert learner.loss_fn.entropy_coeff == pytest.approx(0.005)  # the entropy schedule too
    stats = learner.update(Batch({"x": np.ones((4, 2), np.float32)}), 1, 4, np.random.default_rng(0))
    assert stats["lr"] == pytest.approx(5.5e-4) and stats["entropy_coeff"] == pytest.approx(0.005)


def test_a_record_given_to_the_policy_learner_is_the_one_it_uses():
    cfg = make_config("dqn")
    params = dataclasses.replace(LearnerParams.from_config(cfg), lr=0.5, max_nonfinite_updates=2)
    pl = policy_learner(cfg, learner_params=params)
    assert pl.learner_params is params and pl.learner.lr == 0.5 and pl.learner.max_nonfinite_updates == 2


def test_a_changed_config_builds_a_new_record():
    cfg = make_config("appo")
    pl = policy_learner(cfg)
    before = pl.learner_params
    changed = cfg.copy_with({"lr": 1e-2, "grad_clip": 1.0, "kl_target": 0.05})
    pl.apply_config(changed)
    assert before.lr == 2e-3  # the old record is unchanged
    assert (pl.learner_params.lr, pl.learner_params.grad_clip, pl.learner_params.kl_target) == (1e-2, 1.0, 0.05)
    assert (pl.learner.lr, pl.learner.grad_clip, pl.kl.target) == (1e-2, 1.0, 0.05)


def test_fragment_length_on_the_base_config():
    assert AlgorithmConfig(env="CartPole-v1", rollout_fragment_length=32).fragment_length() == 32
    with pytest.raises(ConfigError, match="rollout_fragment_length is 'auto'.*define fragment_length"):
        AlgorithmConfig(env="CartPole-v1").fragment_length()
    # each algorithm resolves 'auto' its own way
    ppo = PPOConfig(env="CartPole-v1", train_batch_size=400, resources={"num_envs_per_worker": 4})
    assert ppo.fragment_length() == 100  # the train batch over the envs
    assert DQNConfig(env="CartPole-v1").fragment_length() == 16
