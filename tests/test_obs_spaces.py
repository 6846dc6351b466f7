"""Dict and Tuple observations: concatenated rows in order (Discrete one-hot, MultiBinary and
Box entries flattened), clear errors for entries no MLP takes, single observations in predict,
and PPO and SAC learning from them."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest

from shoal import PPOConfig
from shoal.errors import EnvError
from shoal.spaces import flat_obs_dim, is_single_obs, obs_nbytes, preprocess_obs, stack_obs

DICT = gym.spaces.Dict(
    {
        "pos": gym.spaces.Box(-1, 1, (2,), np.float32),
        "mode": gym.spaces.Discrete(3, start=1),
        "bits": gym.spaces.MultiBinary(2),
    }
)


def test_dict_rows_are_the_entries_in_key_order():
    assert list(DICT.spaces) == ["bits", "mode", "pos"]  # gymnasium sorts a plain dict's keys
    assert flat_obs_dim(DICT) == 2 + 3 + 2 and obs_nbytes(DICT) == 4 * 7
    batch = {
        "pos": np.array([[0.5, -0.5], [1.0, 0.0]], np.float32),
        "mode": np.array([1, 3]),
        "bits": np.array([[1, 0], [0, 1]], np.int8),
    }
    rows = preprocess_obs(DICT, batch)
    assert rows.dtype == np.float32
    np.testing.assert_array_equal(rows, [[1, 0, 1, 0, 0, 0.5, -0.5], [0, 1, 0, 0, 1, 1, 0]])
    one = {"pos": np.array([0.5, -0.5], np.float32), "mode": 1, "bits": np.array([1, 0], np.int8)}
    assert is_single_obs(DICT, one) and not is_single_obs(DICT, batch)
    np.testing.assert_array_equal(preprocess_obs(DICT, stack_obs([one])), rows[:1])


def test_tuple_and_nested_entries():
    space = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Dict({"v": gym.spaces.Box(0, 1, (3,))})))
    assert flat_obs_dim(space) == 5
    rows = preprocess_obs(space, (np.array([1]), {"v": np.array([[0.1, 0.2, 0.3]], np.float32)}))
    np.testing.assert_allclose(rows, [[0, 1, 0.1, 0.2, 0.3]], rtol=1e-6)


def test_entries_no_mlp_takes_are_named():
    image = gym.spaces.Dict({"camera": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8), "v": gym.spaces.Box(0, 1, (2,))})
    with pytest.raises(EnvError, match=r"Observation entry \['camera'\] is an image"):
        flat_obs_dim(image)
    text = gym.spaces.Dict({"name": gym.spaces.Text(5)})
    with pytest.raises(EnvError, match=r"Observation entry \['name'\] is Text"):
        flat_obs_dim(text)


@pytest.mark.learning
def test_ppo_learns_from_a_dict_observation_and_predicts_from_one(tmp_path):
    """Random play names the signal 1 time in 3 (3.3 per 10-step episode); PPO passes 9."""
    import shoal

    algo = PPOConfig(
        env="space_envs:DictSignal", seed=0, lr=3e-3, train_batch_size=1000, minibatch_size=250, num_sgd_iter=4
    ).build()
    try:
        best, r = -math.inf, {}
        while r.get("env_steps_sampled", 0) < 40_000 and best < 9:
            r = algo.train()
            best = max(best, r["episode_return_mean"])
        assert best >= 9, f"best mean return {best:.2f}"
        path = algo.save(tmp_path / "ckpt")
    finally:
        algo.stop()
    obs = {"signal": 2, "noise": np.zeros((2, 2), np.float32), "flags": np.array([0, 1], np.int8)}
    with shoal.load_policy(path) as policy:
        action, _ = policy.predict(obs, deterministic=True)
        assert int(action) == 2
        batch = stack_obs([obs, {**obs, "signal": 0}])
        actions, _ = policy.predict(batch, deterministic=True)
        assert actions.tolist() == [2, 0]
