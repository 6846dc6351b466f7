"""Ape-X TD3: the TD3 loss against a hand-worked example, the delayed actor updates, per-actor
noise, config refusals, checkpoints with load_policy, and a killed rollout actor on Ray."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import trains_within

from shoal.algorithms.apex_td3 import ApeXTD3, ApeXTD3Config, NoisyDeterministicPolicy, TD3Loss, TD3Module
from shoal.batch import Col
from shoal.errors import ConfigError

OBS1 = gym.spaces.Box(-10.0, 10.0, (1,), np.float32)
ACT1 = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)


def _linear_module(cfg: ApeXTD3Config) -> TD3Module:
    """1-D observation and action, no hidden layers: mu = 0.5 s + 0.1 (action tanh(mu)); Q_1 = s + a,
    Q_2 = 2 s - a + 0.5; the targets: mu' = s, Q'_1 = s + 2 a, Q'_2 = s - a."""
    m = TD3Module(OBS1, ACT1, cfg)
    with torch.no_grad():
        m.nets["actor"].head.weight.fill_(0.5)
        m.nets["actor"].head.bias.fill_(0.1)
        m.nets["critic"].weights[0].copy_(torch.tensor([[[1.0], [1.0]], [[2.0], [-1.0]]]))
        m.nets["critic"].biases[0].copy_(torch.tensor([[[0.0]], [[0.5]]]))
        m.target["actor"].head.weight.fill_(1.0)
        m.target["actor"].head.bias.fill_(0.0)
        m.target["critic"].weights[0].copy_(torch.tensor([[[1.0], [2.0]], [[1.0], [-1.0]]]))
        m.target["critic"].biases[0].zero_()
    return m


BATCH = {
    Col.OBS: torch.tensor([[1.0], [-2.0]]),
    Col.ACTIONS: torch.tensor([[0.5], [-0.25]]),
    Col.REWARDS: torch.tensor([1.0, -1.0]),
    Col.NEXT_OBS: torch.tensor([[0.3], [3.0]]),
    Col.TERMINATEDS: torch.tensor([0.0, 1.0]),
    Col.DISCOUNTS: torch.tensor([0.9, 0.9]),
}


def test_td3_loss_hand_worked():
    cfg = ApeXTD3Config(env="Pendulum-v1", model={"hiddens": []}, target_noise=0.2, target_noise_clip=0.1)
    m = _linear_module(cfg)
    torch.manual_seed(3)
    eps = torch.randn(2, 1)  # the target smoothing noise the loss draws
    torch.manual_seed(3)
    loss, stats = TD3Loss.from_config(cfg)(m, BATCH)

    obs, act, rew, nxt, term = [1.0, -2.0], [0.5, -0.25], [1.0, -1.0], [0.3, 3.0], [0.0, 1.0]
    critic, td, actor = [], [], []
    for i in range(2):
        noise = float(np.clip(0.2 * eps[i, 0].item(), -0.1, 0.1))
        a2 = float(np.clip(np.tanh(nxt[i]) + noise, -1, 1))
        y = rew[i] + 0.9 * (1 - term[i]) * min(nxt[i] + 2 * a2, nxt[i] - a2)
        qa, qb = obs[i] + act[i], 2 * obs[i] - act[i] + 0.5
        critic.append(0.5 * ((qa - y) ** 2 + (qb - y) ** 2))
        td.append((qa + qb) / 2 - y)
        actor.append(-(obs[i] + np.tanh(0.5 * obs[i] + 0.1)))  # -Q_1(s, mu(s))
    assert stats["critic_loss"].item() == pytest.approx(np.mean(critic), rel=1e-5)
    np.testing.assert_allclose(stats["td_error"].numpy(), td, rtol=1e-5)
    assert stats["actor_loss"].item() == pytest.approx(np.mean(actor), rel=1e-5)
    assert loss.item() == pytest.approx(np.mean(critic) + np.mean(actor), rel=1e-5)


def test_actor_learns_every_policy_delay_updates_and_targets_follow_then():
    cfg = ApeXTD3Config(env="Pendulum-v1", model={"hiddens": [8]}, policy_delay=3, tau=0.5)
    from shoal.algorithms.apex_td3 import TD3PolicyLearner

    pl = TD3PolicyLearner(cfg, OBS1, ACT1, seed=0)
    learner, module = pl.learner, pl.learner.module
    batch = {k: v.repeat(4, *[1] * (v.dim() - 1)) for k, v in BATCH.items()}
    trained = []
    for _ in range(6):
        actor_before = [p.detach().clone() for p in module.nets["actor"].parameters()]
        target_before = [p.detach().clone() for p in module.target.parameters()]
        stats = learner.update_minibatch(batch)
        moved = any(not torch.equal(a, p) for a, p in zip(actor_before, module.nets["actor"].parameters()))
        target_moved = any(not torch.equal(a, p) for a, p in zip(target_before, module.target.parameters()))
        trained.append((moved, "actor_loss" in stats, target_moved))
    # updates 0 and 3 train the actor, and the targets are blended right after them (every third step)
    assert [t[0] for t in trained] == [True, False, False, True, False, False]
    assert [t[1] for t in trained] == [True, False, False, True, False, False]
    assert [t[2] for t in trained] == [True, False, False, True, False, False]
    assert pl.target.num_updates == 2


def test_noise_is_per_env_and_greedy_actions_are_the_actors():
    cfg = ApeXTD3Config(env="Pendulum-v1", model={"hiddens": [8]})
    space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    policy = NoisyDeterministicPolicy(gym.spaces.Box(-1, 1, (3,), np.float32), space, cfg, seed=0)
    obs = np.random.default_rng(0).normal(size=(4000, 3)).astype(np.float32)
    greedy, _ = policy.act(obs, explore=False)
    expected = torch.tanh(policy.module(torch.from_numpy(obs))[0]).detach().numpy()
    np.testing.assert_allclose(greedy, expected, rtol=1e-6)
    policy.epsilon = np.array([0.0, 0.05] * 2000)  # one std per env of the vector
    noisy, _ = policy.act(obs, explore=True)
    np.testing.assert_allclose(noisy[0::2], expected[0::2], rtol=1e-6)
    assert np.std(noisy[1::2] - expected[1::2]) == pytest.approx(0.05, rel=0.1)
    env_actions = policy.to_env_actions(np.array([[-1.0], [0.0], [1.0], [3.0]], np.float32))
    np.testing.assert_allclose(env_actions[:, 0], [-2.0, 0.0, 2.0, 2.0])


def test_random_warmup_steps_are_uniform_then_the_noisy_actor():
    cfg = ApeXTD3Config(env="Pendulum-v1", model={"hiddens": [8]}, random_warmup_steps=3000)
    space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    policy = NoisyDeterministicPolicy(gym.spaces.Box(-1, 1, (3,), np.float32), space, cfg, seed=0)
    obs = np.random.default_rng(0).normal(size=(2000, 3)).astype(np.float32)
    expected = torch.tanh(policy.module(torch.from_numpy(obs))[0]).detach().numpy()
    greedy, _ = policy.act(obs, explore=False)  # evaluation is never random and uses up no warm-up
    np.testing.assert_allclose(greedy, expected, rtol=1e-6)
    for _ in range(2):  # 4,000 steps of the 2,000-env vector cover the 3,000 warm-up steps
        warm, _ = policy.act(obs, explore=True)
        assert warm.min() < -0.9 and warm.max() > 0.9 and abs(float(warm.mean())) < 0.05  # uniform in [-1, 1]
        assert np.corrcoef(warm[:, 0], expected[:, 0])[0, 1] < 0.1
    after, _ = policy.act(obs, explore=True)  # epsilon 0: the actor's own actions
    np.testing.assert_allclose(after, expected, rtol=1e-6)


def test_apex_td3_refuses_what_it_cannot_train():
    with pytest.raises(ConfigError, match=r"apex_td3 needs a bounded Box action space.*Discrete"):
        ApeXTD3Config(env="CartPole-v1", resources={"num_workers": 0}).build()
    for key, value in (("dueling", True), ("worker_side_prioritization", True), ("exploration_timesteps", 10)):
        with pytest.raises(ConfigError, match=key):
            ApeXTD3Config(env="Pendulum-v1", **{key: value})
    with pytest.raises(ConfigError, match="normalize"):
        ApeXTD3Config(env="Pendulum-v1", normalize={"obs": True})


def _small(**kw) -> ApeXTD3Config:
    base = {
        "env": "Pendulum-v1",
        "seed": 0,
        "learning_starts": 200,
        "train_batch_size": 64,
        "training_intensity": 64.0,
        "replay_capacity": 5000,
        "model": {"hiddens": [32, 32]},
        "min_time_s_per_iteration": 0.0,
        "min_env_steps_per_iteration": 200,
        "resources": {"num_workers": 0, "num_envs_per_worker": 2, "num_replay_shards": 1},
    }
    for k, v in kw.items():
        base[k] = {**base[k], **v} if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return ApeXTD3Config(**base)


def test_apex_td3_trains_checkpoints_and_loads_as_a_policy(tmp_path):
    import shoal

    algo = _small().build()
    algo2 = None
    try:
        r = {}
        for _ in range(4):
            r = algo.train()
        assert r["env_steps_trained"] > 0 and np.isfinite(r["learner/critic_loss"])
        # the per-env noise of the driver's runner spreads like Ape-X's epsilons: 0.4 and 0.4 ** 4
        np.testing.assert_allclose(algo.env_runners.actors[0].policy.epsilon, [0.4, 0.4**4])
        path = algo.save(tmp_path / "ckpt")
        algo.stop()  # its learner thread trains on after the save: the checkpoint is what counts
        algo2 = ApeXTD3.from_checkpoint(path)
        assert algo2.counters["env_steps_sampled"] >= r["env_steps_sampled"]
        policy = shoal.load_policy(path)
        obs = np.array([0.5, -0.2, 1.0], np.float32)
        action, _ = policy.predict(obs, deterministic=True)
        actor = algo2.learner.module.nets["actor"]  # the restored actor, as saved
        expected = 2.0 * actor.action(torch.from_numpy(obs)[None]).detach().numpy()[0]
        np.testing.assert_allclose(action, expected, rtol=1e-5)
        assert trains_within(algo2) > 0
    finally:
        algo.stop()
        if algo2 is not None:
            algo2.stop()


@pytest.mark.ray
def test_apex_td3_with_two_rollout_actors_survives_a_killed_one(ray_cluster):
    import ray

    algo = _small(
        resources={"num_workers": 2, "num_envs_per_worker": 1, "num_cpus_per_worker": 0.5, "replay_shard_cpus": 0.0}
    ).build()
    try:
        r = algo.train()
        assert sorted(algo.env_runners.actor_ids) == [1, 2]
        old = algo.env_runners.actors[1]
        ray.kill(old, no_restart=True)
        for _ in range(60):
            r = algo.train()
            if r["num_worker_restarts"] >= 1 and r["env_steps_trained"] > 0:
                break
        assert r["num_worker_restarts"] == 1 and algo.env_runners.actors[1] is not old
        r2 = algo.train()
        assert r2["env_steps_sampled"] > r["env_steps_sampled"] and r2["env_steps_trained"] > r["env_steps_trained"]
    finally:
        algo.stop()
