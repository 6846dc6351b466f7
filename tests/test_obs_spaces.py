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


def test_entries_no_network_takes_are_named():
    nested = gym.spaces.Dict({"sub": gym.spaces.Dict({"camera": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)})})
    with pytest.raises(EnvError, match=r"Observation entry \['sub'\]\['camera'\] is an image .* top level"):
        flat_obs_dim(nested)
    flat = gym.spaces.Dict({"gray": gym.spaces.Box(0, 255, (8, 8), np.uint8)})
    with pytest.raises(EnvError, match=r"\['gray'\] is a uint8 array of shape \(8, 8\); an image entry needs three"):
        flat_obs_dim(flat)
    text = gym.spaces.Dict({"name": gym.spaces.Text(5)})
    with pytest.raises(EnvError, match=r"Observation entry \['name'\] is Text"):
        flat_obs_dim(text)


IMAGE_DICT = gym.spaces.Dict(
    {
        "camera": gym.spaces.Box(0, 255, (6, 6, 2), np.uint8),
        "mode": gym.spaces.Discrete(2),
        "v": gym.spaces.Box(-1, 1, (2,)),
    }
)


def test_image_entries_travel_as_bytes_and_each_gets_its_torso():
    import torch

    from shoal.models.catalog import DictTorso, build_torso

    batch = {
        "camera": np.arange(2 * 72, dtype=np.uint8).reshape(2, 6, 6, 2),
        "mode": np.array([1, 0]),
        "v": np.array([[0.25, -0.5], [1.0, 0.0]], np.float32),
    }
    rows = preprocess_obs(IMAGE_DICT, batch)
    # the image's 72 bytes, then mode one-hot and v as float32 bytes: one uint8 row
    assert rows.dtype == np.uint8 and rows.shape == (2, 72 + 4 * 4) and flat_obs_dim(IMAGE_DICT) == 88
    assert obs_nbytes(IMAGE_DICT) == 88
    np.testing.assert_array_equal(rows[:, :72], batch["camera"].reshape(2, -1))
    np.testing.assert_array_equal(rows[:, 72:].view(np.float32), [[0, 1, 0.25, -0.5], [1, 0, 1.0, 0.0]])
    torso, width = build_torso(IMAGE_DICT, "auto", [[4, 3, 1]], "relu")
    assert isinstance(torso, DictTorso) and width == 4 * 4 * 4 + 4
    feats = torso(torch.from_numpy(rows))
    alone = torso.torsos[0](torch.from_numpy(batch["camera"].reshape(2, -1)))  # the conv torso on the image alone
    torch.testing.assert_close(feats[:, :64], alone)
    torch.testing.assert_close(feats[:, 64:], torch.tensor([[0, 1, 0.25, -0.5], [1, 0, 1.0, 0.0]]))
    small, width = build_torso(IMAGE_DICT, "auto", None, "relu")  # no CNN fits 6x6: pixels scaled to [0, 1]
    assert width == 72 + 4
    torch.testing.assert_close(small(torch.from_numpy(rows))[:, :72], torch.from_numpy(rows[:, :72]).float() / 255)


def test_float32_bytes_decode_exactly_without_a_dtype_view():
    """What an exported Dict torso computes instead of a view: bit for bit the same floats."""
    import torch

    from shoal.models.catalog import float32_from_bytes

    rng = np.random.default_rng(0)
    values = np.concatenate(
        [rng.normal(size=500) * 10.0 ** rng.integers(-40, 38, 500), [0.0, -0.0, 1e-45, -3.4e38, 1.0]]
    ).astype(np.float32)[None]
    decoded = float32_from_bytes(torch.from_numpy(values.view(np.uint8).copy())).numpy()
    np.testing.assert_array_equal(decoded.view(np.uint32), values.view(np.uint32))


def test_image_entries_stay_uint8_in_replay_and_sac_refuses_them():
    from shoal import DQNConfig
    from shoal.batch import Col
    from shoal.errors import ConfigError

    dqn = DQNConfig(
        env="space_envs:PixelPair",
        seed=0,
        learning_starts=64,
        min_env_steps_per_iteration=128,
        model={"conv_filters": [[4, 3, 2]]},
    ).build()
    try:
        dqn.train()
        replayed = dqn.replay.sample(8)
        assert replayed[Col.OBS].dtype == np.uint8 and replayed[Col.OBS].shape == (8, 64 + 4)
    finally:
        dqn.stop()
    from shoal import APPOConfig

    lstm = APPOConfig(  # a recurrent model behind the image torso
        env="space_envs:PixelPair",
        seed=0,
        model={"conv_filters": [[4, 3, 2]], "use_lstm": True, "lstm_cell_size": 16},
        resources={"num_envs_per_worker": 2},
    ).build()
    try:
        assert lstm.train()["env_steps_trained"] > 0
    finally:
        lstm.stop()
    from shoal.algorithms.sac import check_sac_spaces

    with pytest.raises(ConfigError, match=r"sac here takes vector observations.*\['camera'\] is an image"):
        check_sac_spaces(IMAGE_DICT, gym.spaces.Box(-1, 1, (1,)))


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


@pytest.mark.learning
def test_ppo_learns_from_an_image_and_a_vector_together():
    """PixelPair's answer needs both entries: 4 of 16 at random, 8 from either entry alone."""
    algo = PPOConfig(
        env="space_envs:PixelPair",
        seed=0,
        lr=1e-3,
        train_batch_size=1024,
        minibatch_size=256,
        num_sgd_iter=4,
        model={"conv_filters": [[8, 3, 2]], "hiddens": [64]},
    ).build()
    try:
        best, r = -math.inf, {}
        while r.get("env_steps_sampled", 0) < 80_000 and best < 14:
            r = algo.train()
            best = max(best, r["episode_return_mean"])
        assert best >= 14, f"best mean return {best:.2f} after {r['env_steps_sampled']} steps"
    finally:
        algo.stop()
