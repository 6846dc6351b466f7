"""shoal.load_policy: a checkpoint's policy answering predict in-process, without Ray."""

from __future__ import annotations

import subprocess
import sys

import numpy as np


def test_load_policy_predicts_like_the_trained_algorithm_and_starts_no_ray(tmp_path):
    from shoal import PPOConfig, train

    config = PPOConfig(
        env="shoal.envs.memory:RememberCue",
        env_config={"delay": 2},
        seed=0,
        lr=1e-3,
        rollout_fragment_length=32,
        minibatch_size=128,
        model={"use_lstm": True, "lstm_cell_size": 16, "hiddens": [16]},
        resources={"num_envs_per_worker": 8},
    )
    summary = train(config, {"iterations": 3}, out=str(tmp_path), progress=False)
    code = f"""
import numpy as np, ray, shoal
policy = shoal.load_policy({str(summary.run_dir)!r})
assert policy.recurrent and policy.observation_space.shape == (3,)
obs = np.array([[1, 0, 0], [0, 1, 0]], np.float32)
actions, state = policy.predict(obs)
actions2, state2 = policy.predict(np.zeros((2, 3), np.float32), state)
assert actions.shape == (2,) and state.shape == (2, 64) and state2.shape == (2, 64)
assert not ray.is_initialized()
np.save({str(tmp_path / "out.npy")!r}, np.concatenate([actions, actions2, state.ravel(), state2.ravel()]))
policy.close()
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    got = np.load(tmp_path / "out.npy")
    # the same answers from the algorithm restored the usual way
    from shoal.framework.base import Algorithm

    algo = Algorithm.from_checkpoint(summary.best_checkpoint)
    try:
        obs = np.array([[1, 0, 0], [0, 1, 0]], np.float32)
        a1, s1 = algo.predict(obs)
        a2, s2 = algo.predict(np.zeros((2, 3), np.float32), s1)
        np.testing.assert_allclose(got, np.concatenate([a1, a2, s1.ravel(), s2.ravel()]), atol=1e-6)
    finally:
        algo.stop()


def test_load_policy_of_an_apex_run_builds_the_q_network_only(tmp_path, monkeypatch):
    """No learner thread, no replay (a 2M-row one would not fit a small machine), the same greedy actions."""
    import threading

    import shoal
    from shoal import ApeXConfig
    from shoal.algorithms import dqn
    from shoal.framework.base import Algorithm

    cfg = ApeXConfig(
        env="CartPole-v1",
        seed=0,
        replay_capacity=4096,
        learning_starts=256,
        train_batch_size=64,
        rollout_fragment_length=16,
        min_time_s_per_iteration=0.0,
        resources={"num_envs_per_worker": 4},
    )
    algo = cfg.build()
    try:
        for _ in range(3):
            algo.train()
        path = algo.save(tmp_path / "ckpt")
        obs = np.random.default_rng(0).normal(0, 1, (16, 4)).astype(np.float32)
        expected, _ = algo.predict(obs)
    finally:
        algo.stop()

    def refuse(*args, **kwargs):
        raise AssertionError("load_policy sized a replay buffer")

    monkeypatch.setattr(dqn, "check_replay_fits", refuse)
    monkeypatch.setattr(Algorithm, "__init__", refuse)  # nor did it build the algorithm
    threads = threading.active_count()
    with shoal.load_policy(path) as policy:
        assert threading.active_count() == threads
        actions, state = policy.predict(obs)
        assert state is None and np.array_equal(actions, expected)
        assert policy.predict(obs[0])[0] == expected[0]  # one observation: one action


def test_load_policy_refuses_a_run_with_several_policies(tmp_path):
    import pytest

    import shoal
    from shoal import PPOConfig
    from shoal.errors import ConfigError

    cfg = PPOConfig(
        env="shoal.envs.signal_match:parallel_env",
        seed=0,
        rollout_fragment_length=10,
        minibatch_size=60,
        resources={"num_envs_per_worker": 4},
        multi_agent={"policies": {"shared": None}},
    )
    algo = cfg.build()
    try:
        path = algo.save(tmp_path / "ckpt")
    finally:
        algo.stop()
    with pytest.raises(ConfigError, match="load_policy serves single-agent policies"):
        shoal.load_policy(path)
