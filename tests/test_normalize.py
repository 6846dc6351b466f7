"""Observation and reward normalization: statistics by hand, the merge across actors, checkpoints,
frozen use at evaluation and in predict, raw reported returns, refusals, and learning with it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from shoal.algorithms.ppo import PPOConfig
from shoal.envs.normalize import Normalizer, RunningStats
from shoal.errors import ConfigError
from shoal.rollout.env_runner import EnvRunner
from shoal.rollout.policies import ActorCriticPolicy


class CountEnv(gym.Env):
    """Observes [t], rewards t at step t, ends (terminated) after step 3: returns 1 + 2 + 3 = 6."""

    observation_space = gym.spaces.Box(-100, 100, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t], np.float32), float(self.t), self.t == 3, False, {}


def count_runner(**normalize) -> EnvRunner:
    config = PPOConfig(env=CountEnv, seed=0, normalize=normalize, resources={"num_envs_per_worker": 1})
    return EnvRunner(config, 0, ActorCriticPolicy, rollout_fragment_length=4)


def test_statistics_by_hand_on_a_counting_env():
    runner = count_runner(obs=True, reward=True, gamma=0.9)
    frag, metrics = runner._run_fragment(explore=True)
    # Observations counted: the reset 0, then 1, 2, 3 (terminal) and the reset step's 0.
    new = runner.normalizer.new
    assert new.obs.count == 5 and np.allclose(new.obs.mean, [1.2]) and np.allclose(new.obs.var, [1.36])
    # Discounted returns of the live steps: 1, 0.9 * 1 + 2 = 2.9, 0.9 * 2.9 + 3 = 5.61.
    assert new.ret.count == 3 and np.isclose(new.ret.mean, 3.17) and np.isclose(new.ret.var, 3.578466666666667)
    # obs 2 was normalized by the statistics of 0, 1, 2: mean 1, var 2/3.
    assert np.isclose(frag.obs[2, 0, 0], (2 - 1) / np.sqrt(2 / 3))
    # reward 3 was scaled by the std of the three returns; the first (std 0) was clipped to 10.
    assert np.isclose(frag.rewards[2, 0], 3 / np.sqrt(3.578466666666667), atol=1e-6)
    assert frag.rewards[0, 0] == 10.0 and frag.rewards[3, 0] == 0.0  # the reset step carries nothing
    assert metrics.episode_returns == [6.0]  # reported returns stay raw


def test_reported_returns_stay_raw_through_sample():
    runner = count_runner(reward=True)
    _, metrics = runner.sample()
    assert metrics.episode_returns == [6.0] and metrics.normalizer_new.ret.count == 3
    assert metrics.normalizer_new.obs is None  # obs normalization off: nothing gathered for it


def test_merge_by_counts_matches_the_pooled_moments():
    a, b, total = RunningStats((1,), True), RunningStats((1,), True), RunningStats((1,), True)
    a.obs.update(np.array([[1.0], [2.0], [3.0]]))
    b.obs.update(np.array([[10.0], [20.0]]))
    total.merge(a)
    total.merge(b)
    # pooled: mean (1+2+3+10+20)/5 = 7.2; mean of squares 514/5 = 102.8; var 102.8 - 7.2^2 = 50.96
    assert total.obs.count == 5 and np.allclose(total.obs.mean, [7.2]) and np.allclose(total.obs.var, [50.96])
    assert total.ret.count == 0  # nothing gathered: the merge leaves it empty


def test_an_actor_hands_over_each_sample_once():
    config = PPOConfig(env=CountEnv, normalize={"obs": True})
    n = Normalizer(config, RunningStats((1,), False), num_envs=1)
    n.observations(np.array([[1.0], [3.0]]))
    first = n.take_new()
    n.observations(np.array([[5.0]]))
    second = n.take_new()
    assert first.obs.count == 2 and second.obs.count == 1 and np.allclose(second.obs.mean, [5.0])
    driver = RunningStats((1,), False)
    driver.merge(first)
    driver.merge(second)
    n.set_stats(driver.get_state())
    assert n.current().obs.count == 3 and np.allclose(n.current().obs.mean, [3.0])
    # evaluation uses them frozen: nothing is counted
    assert np.allclose(n.observations(np.array([[3.0 + np.sqrt(8 / 3)]]), update=False), [[1.0]], atol=1e-6)
    assert n.new.obs.count == 0


def trained(tmp_path, **extra):
    config = PPOConfig(
        env="CartPole-v1",
        seed=0,
        train_batch_size=512,
        minibatch_size=256,
        num_sgd_iter=2,
        normalize={"obs": True, "reward": True},
        **extra,
    )
    algo = config.build()
    algo.train()
    algo.train()
    return algo, algo.save(tmp_path / "ckpt")


def test_checkpoint_round_trip_and_frozen_evaluation(tmp_path):
    from shoal import load_policy
    from shoal.framework.base import Algorithm

    algo, path = trained(tmp_path)
    try:
        saved = algo.norm_stats.get_state()
        assert saved["obs"]["count"] > 500 and saved["ret"]["count"] > 500
        restored = Algorithm.from_checkpoint(path)
        assert restored.norm_stats.get_state() == saved
        restored.evaluate(2)
        assert restored.norm_stats.get_state() == saved  # evaluation counts nothing
        assert restored.evaluator.local.normalizer.synced.get_state() == saved  # and uses the saved statistics
        restored.stop()
        # predict on raw observations == the same network without normalization on normalized ones
        raw = np.random.default_rng(0).normal(0, 1, (64, 4)).astype(np.float32) * [1, 2, 0.2, 2]
        policy = load_policy(path)
        plain = PPOConfig(env="CartPole-v1", train_batch_size=512, minibatch_size=256).build()
        plain.set_state(algo.get_state())
        mean, var = np.array(saved["obs"]["mean"]), np.array(saved["obs"]["var"])
        normalized = np.clip((raw - mean) / np.sqrt(var + 1e-8), -10, 10).astype(np.float32)
        assert (policy.predict(raw)[0] == plain.predict(normalized)[0]).all()
        assert (algo.predict(raw)[0] == plain.predict(normalized)[0]).all()
        policy.close()
        plain.stop()
    finally:
        algo.stop()


def test_refusals():
    from shoal.algorithms.apex import ApeXConfig
    from shoal.envs.pixel_catch import PixelCatch

    with pytest.raises(ConfigError, match="uint8 pixel observations"):
        PPOConfig(env=PixelCatch, normalize={"obs": True}).build()
    with pytest.raises(ConfigError, match="one-hot"):
        PPOConfig(env="FrozenLake-v1", normalize={"obs": True}).build()
    with pytest.raises(ConfigError, match="normalize.clip_obs is set but normalize.obs is false"):
        PPOConfig(env="CartPole-v1", normalize={"clip_obs": 5.0})
    with pytest.raises(ConfigError, match="normalize.gamma is set but normalize.reward is false"):
        PPOConfig(env="CartPole-v1", normalize={"obs": True, "gamma": 0.9})
    with pytest.raises(ConfigError, match="not used by apex"):
        ApeXConfig(env="CartPole-v1", normalize={"reward": True})
    with pytest.raises(ConfigError, match="not supported with a multi_agent section"):
        PPOConfig(
            env="shoal.envs.signal_match:parallel_env",
            multi_agent={"policies": {"shared": None}},
            normalize={"reward": True},
        ).build()
    PPOConfig(env=PixelCatch, normalize={"reward": True}).build().stop()  # rewards of pixel envs may be scaled


def test_one_ray_rollout_actor_sends_its_statistics_to_the_driver(tmp_path):
    config = PPOConfig(
        env="CartPole-v1",
        seed=0,
        train_batch_size=256,
        minibatch_size=256,
        num_sgd_iter=1,
        rollout_fragment_length=32,
        normalize={"obs": True, "reward": True},
        resources={"num_workers": 1, "num_envs_per_worker": 8},
    )
    algo = config.build()
    try:
        r = {}
        for _ in range(2):
            r = algo.train()
        stats = algo.norm_stats
        # every observation row the actor acted on (8 initial + 32 x 8 per sample) and one return per live step
        samples = r["iteration"] * (256 // (32 * 8))
        assert stats.obs.count == 8 + samples * 32 * 8
        assert stats.ret.count == r["env_steps_sampled"]
    finally:
        algo.stop()


@pytest.mark.learning
def test_ppo_with_normalization_solves_cartpole():
    from shoal.app.trainer import train

    config = PPOConfig(
        env="CartPole-v1",
        seed=0,
        gamma=0.98,
        gae_lambda=0.9,
        lr=0.003,
        train_batch_size=4096,
        minibatch_size=2048,
        num_sgd_iter=8,
        entropy_coeff=0.0,
        resources={"num_envs_per_worker": 64},
        normalize={"obs": True, "reward": True},
    )
    summary = train(config, {"reward": 475, "time_s": 60}, out=None, progress=False)  # ~2-4 s of training here
    assert summary.solved, (
        f"best mean return {summary.best_return:.1f} after {summary.result['env_steps_sampled']} steps"
    )


def test_box_actions_turn_reward_normalization_on_where_the_config_leaves_it_unset(tmp_path):
    from shoal.algorithms.ppo import PPO
    from shoal.config_reference import key_reference

    box, discrete = gym.spaces.Box(-1, 1, (1,)), gym.spaces.Discrete(2)
    plain = PPOConfig(env="Pendulum-v1")
    assert plain.for_env(None, box).normalize.reward is True
    assert plain.for_env(None, discrete) is plain  # Discrete actions: nothing changes
    kept = PPOConfig(env="Pendulum-v1", normalize={"reward": False, "obs": True})
    assert kept.for_env(None, box) is kept  # what the config sets stays
    partly = PPOConfig(env="Pendulum-v1", normalize={"obs": True}).for_env(None, box)
    assert partly.normalize.obs and partly.normalize.reward
    rows = {key: default for key, _, default, _ in key_reference(PPOConfig)}
    assert rows["normalize.reward"] == "False (Box actions: True)"
    algo = PPOConfig(env="Pendulum-v1", seed=0, train_batch_size=512, minibatch_size=128).build()
    try:
        assert algo.config.normalize.reward  # the built run holds the applied value, and saves it
        path = algo.save(tmp_path / "ckpt")
    finally:
        algo.stop()
    restored = PPO.from_checkpoint(path)
    try:
        assert restored.config.normalize.reward and restored.norm_stats is not None
    finally:
        restored.stop()


@pytest.mark.learning
def test_ppo_defaults_learn_pendulum():
    """With no preset PPO reached -155 after 200k steps (-990 without reward normalization);
    here -400 within 160k steps."""
    algo = PPOConfig(env="Pendulum-v1", seed=0).build()
    try:
        r = {}
        while r.get("env_steps_sampled", 0) < 160_000:
            r = algo.train()
        assert r["episode_return_mean"] >= -400, r["episode_return_mean"]
    finally:
        algo.stop()
