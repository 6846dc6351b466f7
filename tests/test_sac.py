"""SAC: the squashed Gaussian's log-probability and the twin critics against hand-computed values,
the three loss terms on a hand-worked linear example, the rollout policy, config errors, a
checkpoint round trip with load_policy, learning on Pendulum in-process, and a killed rollout
actor on Ray."""

from __future__ import annotations

import math
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

from shoal.algorithms.sac import SAC, SACConfig, SACLoss, SACModule, SquashedGaussianPolicy, TwinQ, squashed_logp
from shoal.batch import Col
from shoal.errors import ConfigError

OBS1 = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
ACT1 = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)


# ---- math ---------------------------------------------------------------------------------
def test_squashed_logp_hand_values():
    # u = 0, N(0, 1): log N(0) = -0.5 log(2 pi); tanh'(0) = 1 adds nothing
    zero = torch.zeros(1, 1)
    assert squashed_logp(zero, zero, zero).item() == pytest.approx(-0.5 * math.log(2 * math.pi), abs=1e-6)
    # u = 1, N(0, 1): -0.5 - 0.5 log(2 pi) - log(1 - tanh(1)^2)
    one = torch.ones(1, 1)
    expected = -0.5 - 0.5 * math.log(2 * math.pi) - math.log(1 - math.tanh(1.0) ** 2)
    assert squashed_logp(one, zero, zero).item() == pytest.approx(expected, abs=1e-6)
    # two dimensions sum; against torch's own tanh-transformed Normal, including a large |u|
    u = torch.tensor([[0.3, -4.0]])
    mu, log_std = torch.tensor([[0.1, -3.0]]), torch.tensor([[-0.5, 0.4]])
    dist = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mu, log_std.exp()), [torch.distributions.TanhTransform()]
    )
    ref = dist.log_prob(torch.tanh(u).clamp(-1 + 1e-7, 1 - 1e-7)).sum(-1)
    assert squashed_logp(u, mu, log_std).item() == pytest.approx(ref.item(), rel=1e-3)


def test_twin_q_is_two_independent_mlps():
    torch.manual_seed(0)
    q = TwinQ(3, [4], "relu")
    s, a = torch.randn(5, 2), torch.randn(5, 1)
    out = q(s, a)
    assert out.shape == (2, 5)
    x = torch.cat([s, a], -1)
    for i in range(2):
        h = torch.relu(x @ q.weights[0][i] + q.biases[0][i])
        np.testing.assert_allclose(out[i].detach(), (h @ q.weights[1][i] + q.biases[1][i]).squeeze(-1).detach(), 1e-6)
    # detach=True: same values, no gradient into the critics' weights
    out_d = q(s, a, detach=True)
    torch.testing.assert_close(out_d, out)
    assert not out_d.requires_grad


def _linear_module(autotune: bool = True) -> SACModule:
    """1-D observation and action, no hidden layers: mu = 0.5 s + 0.1, log_std = -1; Q_1 = s + a,
    Q_2 = 2 s - a + 0.5 (and the same target critics), alpha = 0.5, target entropy -1."""
    cfg = SACConfig(env="Pendulum-v1", model={"hiddens": []}, initial_alpha=0.5, autotune_alpha=autotune)
    m = SACModule(OBS1, ACT1, cfg)
    with torch.no_grad():
        m.actor.head.weight.copy_(torch.tensor([[0.5], [0.0]]))
        m.actor.head.bias.copy_(torch.tensor([0.1, -1.0]))
        for critic in (m.critic, m.target_critic):
            critic.weights[0].copy_(torch.tensor([[[1.0], [1.0]], [[2.0], [-1.0]]]))
            critic.biases[0].copy_(torch.tensor([[[0.0]], [[0.5]]]))
    return m


def test_sac_loss_terms_hand_worked():
    m = _linear_module()
    batch = {
        Col.OBS: torch.tensor([[1.0], [-2.0]]),
        Col.ACTIONS: torch.tensor([[0.5], [-0.25]]),
        Col.REWARDS: torch.tensor([1.0, -1.0]),
        Col.NEXT_OBS: torch.tensor([[0.0], [3.0]]),
        Col.TERMINATEDS: torch.tensor([0.0, 1.0]),
        Col.DISCOUNTS: torch.tensor([0.9, 0.9]),
    }
    torch.manual_seed(7)
    noise_next, noise_now = torch.randn(2, 1), torch.randn(2, 1)  # the loss draws next actions first
    torch.manual_seed(7)
    loss, stats = SACLoss(autotune_alpha=True)(m, batch)

    alpha, std = 0.5, math.exp(-1.0)

    def squash(s: float, eps: float) -> tuple[float, float]:
        mu = 0.5 * s + 0.1
        u = mu + std * eps
        logp = -0.5 * eps**2 - (-1.0) - 0.5 * math.log(2 * math.pi) - math.log(1 - math.tanh(u) ** 2)
        return math.tanh(u), logp

    def q1(s: float, a: float) -> float:
        return s + a

    def q2(s: float, a: float) -> float:
        return 2 * s - a + 0.5

    obs, act, rew, nxt, term = [1.0, -2.0], [0.5, -0.25], [1.0, -1.0], [0.0, 3.0], [0.0, 1.0]
    critic, actor, alpha_terms, td = [], [], [], []
    for i in range(2):
        a2, logp2 = squash(nxt[i], noise_next[i, 0].item())
        y = rew[i] + 0.9 * (1 - term[i]) * (min(q1(nxt[i], a2), q2(nxt[i], a2)) - alpha * logp2)
        qa, qb = q1(obs[i], act[i]), q2(obs[i], act[i])
        critic.append(0.5 * ((qa - y) ** 2 + (qb - y) ** 2))
        td.append((qa + qb) / 2 - y)
        a_new, logp = squash(obs[i], noise_now[i, 0].item())
        actor.append(alpha * logp - min(q1(obs[i], a_new), q2(obs[i], a_new)))
        alpha_terms.append(-math.log(alpha) * (logp - 1.0))
    assert stats["critic_loss"].item() == pytest.approx(np.mean(critic), rel=1e-5)
    assert stats["actor_loss"].item() == pytest.approx(np.mean(actor), rel=1e-5)
    assert stats["alpha_loss"].item() == pytest.approx(np.mean(alpha_terms), rel=1e-5)
    np.testing.assert_allclose(stats["td_error"].numpy(), td, rtol=1e-5)
    assert loss.item() == pytest.approx(np.mean(critic) + np.mean(actor) + np.mean(alpha_terms), rel=1e-5)
    assert stats["alpha"].item() == pytest.approx(0.5)


def test_each_sac_term_reaches_only_its_own_parameters():
    """One backward of the summed loss gives the critics the critic term's gradient, the actor the
    actor term's and log(alpha) the alpha term's: what three separate optimizers would see."""
    batch = {
        Col.OBS: torch.randn(8, 1),
        Col.ACTIONS: torch.rand(8, 1) * 2 - 1,
        Col.REWARDS: torch.randn(8),
        Col.NEXT_OBS: torch.randn(8, 1),
        Col.TERMINATEDS: torch.zeros(8),
        Col.DISCOUNTS: torch.full((8,), 0.99),
    }
    m = _linear_module()
    torch.manual_seed(3)
    loss, stats = SACLoss(autotune_alpha=True)(m, batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    assert not any(n.startswith("target_critic") for n in grads)

    # each term alone, from the same weights and the same noise
    m3 = _linear_module()
    torch.manual_seed(3)
    obs, actions = batch[Col.OBS], batch[Col.ACTIONS]
    with torch.no_grad():
        a2, lp2 = m3.actor.sample(batch[Col.NEXT_OBS])
        y = batch[Col.REWARDS] + 0.99 * (m3.target_critic(batch[Col.NEXT_OBS], a2).min(0).values - 0.5 * lp2)
    critic_loss = 0.5 * (m3.critic(obs, actions) - y).pow(2).sum(0).mean()
    (g_critic,) = torch.autograd.grad(critic_loss, [m3.critic.weights[0]])
    torch.testing.assert_close(grads["critic.weights.0"], g_critic)
    a_new, logp = m3.actor.sample(obs)
    actor_loss = (0.5 * logp - m3.critic(obs, a_new).min(0).values).mean()
    (g_actor,) = torch.autograd.grad(actor_loss, [m3.actor.head.weight])
    torch.testing.assert_close(grads["actor.head.weight"], g_actor)
    expected_alpha_grad = -(logp.detach() - 1.0).mean()  # d/d log_alpha of -log_alpha (logp + target)
    assert grads["log_alpha"].item() == pytest.approx(expected_alpha_grad.item(), rel=1e-5)


def test_fixed_alpha_has_no_alpha_term():
    m = _linear_module(autotune=False)
    assert not m.log_alpha.requires_grad
    batch = {
        Col.OBS: torch.zeros(2, 1),
        Col.ACTIONS: torch.zeros(2, 1),
        Col.REWARDS: torch.zeros(2),
        Col.NEXT_OBS: torch.zeros(2, 1),
        Col.TERMINATEDS: torch.zeros(2),
        Col.DISCOUNTS: torch.ones(2),
    }
    _, stats = SACLoss(autotune_alpha=False)(m, batch)
    assert "alpha_loss" not in stats and stats["alpha"].item() == pytest.approx(0.5)


# ---- rollout policy -------------------------------------------------------------------------
def test_rollout_policy_bounds_uniform_start_and_greedy_mean():
    space = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 10.0], np.float32))
    cfg = SACConfig(env="Pendulum-v1", learning_starts=100, model={"hiddens": [8]})
    pol = SquashedGaussianPolicy(gym.spaces.Box(-1, 1, (3,), np.float32), space, cfg, seed=0)
    np.testing.assert_allclose(
        pol.to_env_actions(np.array([[-1.0, -1.0], [0.0, 0.0], [1.0, 1.0]])), [[-2, 0], [0, 5], [2, 10]]
    )
    obs = np.random.default_rng(0).normal(size=(4000, 3)).astype(np.float32)
    uniform, _ = pol.act(obs)  # before learning_starts: uniform in [-1, 1], whatever the actor says
    assert uniform.shape == (4000, 2) and abs(uniform.mean()) < 0.05 and uniform.std() == pytest.approx(3**-0.5, 0.05)
    pol.on_global_vars({"env_steps": 100})
    sampled, _ = pol.act(obs[:5])
    greedy, _ = pol.act(obs[:5], explore=False)
    mu = torch.tanh(pol.module(torch.from_numpy(obs[:5]))[0]).detach().numpy()
    np.testing.assert_allclose(greedy, mu, rtol=1e-6)
    assert np.all(np.abs(sampled) <= 1) and not np.allclose(sampled, greedy)


# ---- config errors ----------------------------------------------------------------------------
def test_sac_refuses_what_it_cannot_train():
    with pytest.raises(ConfigError, match="bounded Box action space.*Discrete"):
        SACConfig(env="CartPole-v1").build()
    with pytest.raises(ConfigError, match="learning_starts"):
        SACConfig(env="Pendulum-v1", learning_starts=10, replay_capacity=5)
    with pytest.raises(ConfigError, match="model.use_lstm is not supported by sac"):
        SACConfig(env="Pendulum-v1", model={"use_lstm": True})
    with pytest.raises(ConfigError, match="torso"):
        SACConfig(env="Pendulum-v1", model={"torso": "nature_cnn"})
    with pytest.raises(ConfigError, match="normalize"):
        SACConfig(env="Pendulum-v1", normalize={"obs": True})


# ---- training ---------------------------------------------------------------------------------
def _small(**kw) -> SACConfig:
    return SACConfig(
        **{
            "env": "Pendulum-v1",
            "seed": 0,
            "lr": 1e-3,
            "learning_starts": 200,
            "min_env_steps_per_iteration": 200,
            "train_batch_size": 64,
            "model": {"hiddens": [64, 64]},
            "resources": {"num_envs_per_worker": 2},
            **kw,
        }
    )


def test_sac_trains_checkpoints_and_loads_as_a_policy(tmp_path):
    import shoal

    algo = _small(checkpoint_replay=True).build()
    algo2 = None
    try:
        r = {}
        for _ in range(3):
            r = algo.train()
        sampled, trained = r["env_steps_sampled"], r["env_steps_trained"]
        assert r["replay_size"] == sampled
        # one update of 64 rows per sampled env step once learning started (2 envs: steps come in pairs)
        assert trained % 64 == 0 and abs(trained / 64 - (sampled - 200)) <= 2
        for key in ("critic_loss", "actor_loss", "alpha_loss", "alpha", "entropy", "mean_q"):
            assert np.isfinite(r[f"learner/{key}"]), key
        assert r["learner/alpha"] < 1.0  # the temperature moved from its initial 1.0
        # the target critics trail the critics (blended by tau after every update)
        module = algo.learner.module
        gap = (module.critic.weights[0] - module.target_critic.weights[0]).abs().max().item()
        assert 0 < gap < (module.critic.weights[0]).abs().max().item()

        path = algo.save(tmp_path / "ckpt")
        algo2 = SAC.from_checkpoint(path)
        assert algo2.replay.stats()["size"] == sampled and algo2.counters == algo.counters
        for k, v in algo.learner.module.state_dict().items():
            assert torch.equal(v, algo2.learner.module.state_dict()[k]), k
        assert algo2.env_runners.actors[0].policy.env_steps == sampled  # no uniform actions after a resume
        r2 = algo2.train()
        assert r2["env_steps_sampled"] > sampled

        policy = shoal.load_policy(path)
        obs = np.array([0.5, -0.2, 1.0], np.float32)
        action, _ = policy.predict(obs, deterministic=True)
        actor = algo.learner.module.actor
        expected = 2.0 * torch.tanh(actor(torch.from_numpy(obs)[None])[0]).detach().numpy()[0]
        np.testing.assert_allclose(action, expected, rtol=1e-5)
        assert action.shape == (1,) and -2 <= action[0] <= 2
    finally:
        algo.stop()
        if algo2 is not None:
            algo2.stop()


@pytest.mark.learning
def test_sac_learns_pendulum_in_process():
    """The preset's settings with smaller networks: random play scores about -1,200 per episode;
    SAC passes -700 within about 6,000 env steps here (sized for a loaded 2-core machine)."""
    algo = _small(
        train_batch_size=128,
        learning_starts=500,
        min_env_steps_per_iteration=1000,
        resources={"num_envs_per_worker": 1},
    ).build()
    try:
        best, t0 = -math.inf, time.time()
        while time.time() - t0 < 240:
            r = algo.train()
            best = max(best, r["episode_return_mean"])
            if best >= -700 or r["env_steps_sampled"] >= 12_000:
                break
        assert best >= -700, f"mean return {best:.0f} after {r['env_steps_sampled']} steps"
    finally:
        algo.stop()


# ---- on Ray ---------------------------------------------------------------------------------
@pytest.mark.ray
def test_sac_with_two_rollout_actors_survives_a_killed_one(ray_cluster):
    import ray

    algo = _small(resources={"num_workers": 2, "num_envs_per_worker": 1}).build()
    try:
        r0 = algo.train()
        assert sorted(algo.env_runners.actor_ids) == [1, 2] and r0["env_steps_sampled"] >= 200
        old = algo.env_runners.actors[1]
        ray.kill(old, no_restart=True)
        r = {}
        for _ in range(30):
            r = algo.train()
            if r["num_worker_restarts"] >= 1:
                break
        assert r["num_worker_restarts"] == 1 and algo.env_runners.actors[1] is not old
        r2 = algo.train()
        assert r2["env_steps_sampled"] > r["env_steps_sampled"] and r2["env_steps_trained"] > r["env_steps_trained"]
        # the recreated actor acts with the driver's actor weights and knows learning has started
        for k, v in algo.get_weights().items():
            np.testing.assert_array_equal(algo.env_runners.call(1, "get_weights")[k], v)
    finally:
        algo.stop()


def test_a_partial_model_section_keeps_sacs_defaults():
    assert SACConfig(env="Pendulum-v1").model.hiddens == [256, 256]
    m = SACConfig(env="Pendulum-v1", model={"activation": "tanh"}).model
    assert (m.hiddens, m.activation) == ([256, 256], "tanh")
    m = SACConfig(env="Pendulum-v1", model={"hiddens": [32]}).model
    assert (m.hiddens, m.activation) == ([32], "relu")
