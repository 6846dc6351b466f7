"""model.custom: a user's network by import path, for actor-critic and Q learners, feed-forward and
recurrent, in-process and in Ray actors; clear errors for models that do not fit the protocol."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from shoal.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _repo_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))  # examples.custom_model, as from the repository root
    monkeypatch.chdir(REPO)  # Ray actors get the working directory on their path


def _ppo(**kw):
    from shoal.algorithms.ppo import PPOConfig

    base = dict(
        env="CartPole-v1",
        seed=0,
        train_batch_size=512,
        minibatch_size=256,
        num_sgd_iter=2,
        resources={"num_envs_per_worker": 8},
    )
    return PPOConfig(**{**base, **kw})


# ---- errors at build time ------------------------------------------------------------------
@pytest.mark.parametrize(
    "path, message",
    [
        (
            "custom_models:WrongWidth",
            r"action_dist_inputs for a batch of 2 must have shape \(2, 2\) \(one logit per action "
            r"of Discrete\(2\)\); got \(2, 3\)",
        ),
        (
            "custom_models:OnlyLogits",
            r"must return 2 tensors \(action_dist_inputs of shape \(B, 2\), values of shape \(B,\)\)",
        ),
        ("custom_models:Raises", r"forward failed on a batch of 2 sampled observations: RuntimeError: mat1 and mat2"),
        ("custom_models:RecurrentWithoutUnroll", r"needs unroll\(obs, state, starts, seq_len\)"),
    ],
)
def test_a_model_that_does_not_fit_the_protocol_is_a_clear_error_at_build_time(path, message):
    with pytest.raises(ConfigError, match=message) as info:
        _ppo(model={"custom": path}).build()
    assert path in str(info.value)


@pytest.mark.parametrize(
    "model, message",
    [
        ({"custom": "custom_models:NotAModule"}, "not a torch.nn.Module subclass"),
        ({"custom": "custom_models:Missing"}, "cannot be imported"),
        ({"custom": "no_such_package.models:Net"}, "cannot be imported"),
        ({"custom": "custom_models:SmallQ", "custom_kwargs": {"depth": 3}}, "could not be constructed"),
        ({"custom": "custom_models:SmallQ", "hiddens": [32]}, "model.hiddens describes shoal's own network"),
        ({"custom_kwargs": {"width": 3}}, "model.custom_kwargs is set but model.custom is not"),
        ({"custom": "examples.custom_model:ResidualMLP", "max_seq_len": 8}, "is not recurrent"),
    ],
)
def test_config_errors_name_the_model_key(model, message):
    with pytest.raises(ConfigError, match=message):
        _ppo(model=model).build()


def test_a_q_model_with_the_wrong_width_is_a_clear_error():
    from shoal.algorithms.dqn import DQNConfig

    with pytest.raises(ConfigError, match=r"Q-values of shape \(B, 2\)"):
        DQNConfig(env="CartPole-v1", model={"custom": "custom_models:WrongWidth"}).build()  # returns a pair
    with pytest.raises(ConfigError, match="a recurrent model.custom .* is not supported by dqn"):
        DQNConfig(env="CartPole-v1", model={"custom": "examples.custom_model:GRUPolicy"})


# ---- training with one ---------------------------------------------------------------------
@pytest.mark.learning
def test_the_example_preset_solves_cartpole_with_its_custom_model_and_checkpoints_hold_weights(tmp_path):
    from shoal.algorithms.ppo import PPO, PPOConfig
    from shoal.app.trainer import train
    from shoal.config import load_yaml

    data = load_yaml(REPO / "examples" / "ppo_custom_model.yaml")
    data.pop("stop")
    assert data.pop("algo") == "ppo"
    summary = train(PPOConfig(**data, seed=0), {"reward": 475, "env_steps": 600_000}, out=str(tmp_path), progress=False)
    assert summary.solved, f"best {summary.best_return:.1f} after {summary.result['env_steps_sampled']} steps"
    algo = PPO.from_checkpoint(summary.best_checkpoint)
    try:
        state = algo.learner.module.state_dict()
        assert "net.inp.weight" in state and "net.blocks.1.3.weight" in state  # the class's own layers
        assert algo.evaluate(num_episodes=5)["episode_return_mean"] > 400
    finally:
        algo.stop()
    saved = (Path(summary.best_checkpoint)).rglob("*")
    assert not any(p.suffix == ".py" for p in saved)  # weights, never code


def test_custom_model_loads_in_ray_rollout_actors():
    algo = _ppo(
        model={"custom": "examples.custom_model:ResidualMLP", "custom_kwargs": {"width": 32}},
        resources={"num_workers": 2, "num_envs_per_worker": 4},
    ).build()
    try:
        r = algo.train()
        assert r["env_steps_sampled"] > 400  # 512 steps less the reset steps
        remote = algo.env_runners.call(algo.env_runners.actor_ids[0], "get_weights")
        local = algo.learner.get_weights()
        assert remote.keys() == local.keys() and "net.inp.weight" in remote
        assert remote["net.inp.weight"].shape == (32, 4)
    finally:
        algo.stop()


def test_box_observations_reach_the_model_in_the_space_shape_and_dtype():
    """Frames arrive as (B, *obs_space.shape) uint8, acting and learning alike."""
    from custom_models import ImageShapes

    ImageShapes.seen.clear()
    algo = _ppo(env="shoal.envs.pixel_catch:PixelCatch", model={"custom": "custom_models:ImageShapes"}).build()
    try:
        algo.train()
    finally:
        algo.stop()
    shape = tuple(algo.env_info.observation_space.shape)
    assert len(shape) == 3 and set(ImageShapes.seen) == {(shape, torch.uint8)}


@pytest.mark.learning
def test_a_recurrent_custom_model_learns_a_memory_task():
    """GRUPolicy (recurrent = True): shoal carries, resets and stores its state like its own LSTM's."""
    from shoal.app.trainer import train

    config = _ppo(
        env="shoal.envs.memory:RememberCue",
        env_config={"delay": 4},
        lr=1e-3,
        train_batch_size=512,
        minibatch_size=128,
        num_sgd_iter=4,
        model={"custom": "examples.custom_model:GRUPolicy", "custom_kwargs": {"hidden": 32}, "max_seq_len": 16},
    )
    assert config.fragment_length() == 64 and config.state_sequence_length() == 16
    summary = train(config, {"reward": 0.9, "env_steps": 60_000}, out=None, progress=False)
    assert summary.solved, f"best {summary.best_return:.2f} after {summary.result['env_steps_sampled']} steps"


def test_dqn_trains_a_custom_q_model_and_its_rollout_copy_follows():
    from shoal.algorithms.dqn import DQNConfig

    algo = DQNConfig(
        env="CartPole-v1",
        seed=0,
        model={"custom": "custom_models:SmallQ", "custom_kwargs": {"width": 16}},
        learning_starts=200,
        min_env_steps_per_iteration=400,
    ).build()
    try:
        before = {k: v.copy() for k, v in algo.get_weights().items()}
        for _ in range(3):
            r = algo.train()
        after = algo.get_weights()
        assert r["env_steps_trained"] > 0 and set(after) == {
            "net.net.0.weight",
            "net.net.0.bias",
            "net.net.2.weight",
            "net.net.2.bias",
        }
        assert any(not np.array_equal(before[k], after[k]) for k in after)
        acting = algo.env_runners.call(algo.env_runners.actor_ids[0], "get_weights")
        assert all(np.array_equal(acting[k], after[k]) for k in after)
    finally:
        algo.stop()
