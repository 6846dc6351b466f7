"""Dict and Tuple observations: concatenated rows in order (Discrete one-hot, MultiBinary and
Box entries flattened), clear errors for entries no MLP takes, single observations in predict,
and PPO and SAC learning from them."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
from helpers import trains_within

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
        assert trains_within(lstm) > 0
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


def _mixed(**kwargs) -> gym.Space:
    from space_envs import MixedSignal

    return MixedSignal(**kwargs).observation_space


@pytest.mark.parametrize("tuple_obs", [False, True])
def test_default_models_give_each_image_entry_its_torso(tuple_obs):
    """model.torso auto on a Dict or Tuple with images resolves once, to a DictTorso: the Nature CNN
    for the 84x84 entry, the scaled pixels for the 8x8 one (no CNN preset fits it), then the vector
    and the Discrete's one-hot."""
    import torch

    from shoal.config import ModelConfig
    from shoal.models.catalog import DictTorso, NatureCNN, _ScaledRows, build_actor_critic, build_q_network

    space = _mixed(tuple_obs=tuple_obs)
    ac = build_actor_critic(space, gym.spaces.Discrete(3), ModelConfig())
    q = build_q_network(space, gym.spaces.Discrete(3), ModelConfig(hiddens=[16]))
    for torso in (ac.pi_conv, ac.vf_conv, q.conv):
        assert isinstance(torso, DictTorso)
        assert [type(t) for t in torso.torsos] == [_ScaledRows, NatureCNN]
        assert torso.out_dim == 64 + 512 + 3 + 3
    assert ac.torso == q.torso == "dict"
    obs = space.sample()
    rows = torch.from_numpy(preprocess_obs(space, stack_obs([obs, obs])))
    assert rows.dtype == torch.uint8 and ac(rows)[0].shape == (2, 3) and q(rows).shape == (2, 3)


def test_torso_values_on_an_image_dict_are_checked_once_with_what_is_allowed():
    from shoal.config import ModelConfig
    from shoal.errors import ConfigError
    from shoal.models.catalog import build_actor_critic, build_torso

    space = _mixed()
    allowed = r"auto or one of mlp, nature_cnn, impala_cnn, conv; got '{}'"
    for bad in ("resnet", "dict"):  # "dict" is resolve_torso's answer, not a model.torso value
        with pytest.raises(ConfigError, match=allowed.format(bad)):
            build_torso(space, bad)
    with pytest.raises(ValueError, match=r"model\.torso.*'auto'.*'mlp'.*'nature_cnn'.*'impala_cnn'.*'conv'"):
        PPOConfig(env="space_envs:MixedSignal", model={"torso": "resnet"})
    with pytest.raises(ConfigError, match=r"nature_cnn needs frames of at least 36x36"):  # the 8x8 entry
        build_actor_critic(space, gym.spaces.Discrete(3), ModelConfig(torso="nature_cnn"))
    explicit = build_actor_critic(space, gym.spaces.Discrete(3), ModelConfig(torso="impala_cnn"))
    assert explicit.torso == "impala_cnn" and [t.out_dim for t in explicit.pi_conv.torsos] == [256, 256]


def _mixed_configs(env_config: dict) -> dict:
    """A few small training steps per algorithm, in this process, with the default models."""
    from shoal import APPOConfig, DQNConfig, SACConfig

    common = dict(env="space_envs:MixedSignal", env_config=env_config, seed=0, resources={"num_envs_per_worker": 2})
    replay = dict(replay_capacity=256, min_env_steps_per_iteration=32, train_batch_size=16)
    return {
        "ppo": lambda: PPOConfig(**common, train_batch_size=32, minibatch_size=16, num_sgd_iter=1),
        "appo": lambda: APPOConfig(
            **common, train_batch_size=32, rollout_fragment_length=16, min_time_s_per_iteration=0
        ),
        "dqn": lambda: DQNConfig(**common, **replay, learning_starts=32, training_intensity=1),
        "sac": lambda: SACConfig(**common, **replay, learning_starts=16),
    }


@pytest.mark.parametrize("tuple_obs", [False, True], ids=["dict", "tuple"])
@pytest.mark.parametrize("algo", ["ppo", "appo", "dqn", "sac"])
def test_default_models_train_on_mixed_observations(algo, tuple_obs):
    """Images of 8x8 and 84x84 beside a vector and a Discrete entry (SAC: Box actions, and the
    vector entries only, as it refuses images by name)."""
    env_config = {"tuple_obs": tuple_obs}
    if algo == "sac":
        env_config.update(images=False, box_actions=True)
    algorithm = _mixed_configs(env_config)[algo]().build()
    try:
        for i in range(10):  # APPO's learner thread may take a few iterations to report its first update
            r = algorithm.train()
            if i >= 1 and r["env_steps_trained"] > 0:
                break
        assert r["env_steps_trained"] > 0 and math.isfinite(r["episode_return_mean"]), r
    finally:
        algorithm.stop()
    if algo == "sac":
        from shoal.errors import ConfigError

        with pytest.raises(ConfigError, match=r"sac here takes vector observations; entry \[('patch'|0)\] is an image"):
            _mixed_configs({"tuple_obs": tuple_obs, "box_actions": True})["sac"]().build()
