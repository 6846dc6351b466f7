"""DQN / Ape-X math against hand-computed values, and the components in-process (no Ray).

Every expected number below is written as a literal with the arithmetic that gives it, so a
wrong sum, discount or bootstrap row shows as a plain mismatch.
"""

from __future__ import annotations

import copy
import functools

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from shoal.algorithms.apex import ApeXConfig
from shoal.algorithms.apex_actors import ApeXRunner
from shoal.algorithms.dqn import (
    DQN,
    DQNConfig,
    DQNLoss,
    QLearnerModule,
    QPolicyLearner,
    learn_on_replay_batch,
    n_step_postprocess,
    q_targets,
)
from shoal.batch import Batch, Col
from shoal.errors import ConfigError
from shoal.learn.target import TargetNetwork
from shoal.models import build_q_network
from shoal.replay import ReplayShard
from shoal.rollout import EnvRunner
from shoal.rollout.policies import EpsilonGreedyQPolicy, apex_epsilon
from shoal.rollout.postprocessing import n_step_targets, q_td_errors

F, T_ = False, True


# ---- n-step targets ---------------------------------------------------------------------
def _n_step_case():
    """Four columns of T=6 steps; gamma 0.5, n 3.

    col 0: one episode, no end inside the fragment (ordinary sums, then the fragment end).
    col 1: terminates at step 2; step 3 is the reset step (invalid, reward 100 must never
           be summed); steps 4, 5 are the new episode.
    col 2: truncated at step 1; step 2 is the reset step; steps 3..5 the new episode.
    col 3: terminates at step 5, the fragment's last step.
    """
    rewards = np.array(
        [[1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 100, 3], [4, 100, 4, 4], [5, 5, 8, 5], [6, 6, 16, 6]], dtype=np.float32
    )
    terminateds = np.zeros((6, 4), dtype=bool)
    truncateds = np.zeros((6, 4), dtype=bool)
    valid = np.ones((6, 4), dtype=bool)
    terminateds[2, 1] = True
    valid[3, 1] = False
    truncateds[1, 2] = True
    valid[2, 2] = False
    terminateds[5, 3] = True
    return rewards, terminateds, truncateds, valid


def test_n_step_targets_hand_computed():
    rewards, terms, truncs, valid = _n_step_case()
    ret, disc, term, nxt = n_step_targets(rewards, terms, terms | truncs, valid, n=3, gamma=0.5)
    I = None  # noqa: E741  (invalid (reset) row: only its return is specified (zero)
    exp_ret = np.array(
        [
            # col 0: 1+.5*2+.25*3 | col 1: 1+.5*2+.25*3 (term at 2) | col 2: 1+.5*2 (trunc at 1) | col 3: like col 0
            [2.75, 2.75, 2.0, 2.75],
            # col 0: 2+.5*3+.25*4 | col 1: 2+.5*3 (stops at term) | col 2: 2 (truncated step itself) | col 3: 2+1.5+1
            [4.5, 3.5, 2.0, 4.5],
            # col 0: 3+.5*4+.25*5 | col 1: 3 (the terminating step) | col 2: reset row | col 3: 3+2+1.25
            [6.25, 3.0, 0.0, 6.25],
            # col 0: 4+.5*5+.25*6 | col 1: reset row | col 2: 4+.5*8+.25*16 | col 3: 4+.5*5+.25*6 (term at 5)
            [8.0, 0.0, 12.0, 8.0],
            # fragment end: 5+.5*6 (k=2) | col 1: 5+.5*6 | col 2: 8+.5*16 | col 3: 5+.5*6 (term at 5)
            [8.0, 8.0, 16.0, 8.0],
            # fragment end: 6 (k=1) | 6 | 16 | 6 (terminating step)
            [6.0, 6.0, 16.0, 6.0],
        ],
        dtype=np.float32,
    )
    exp_disc = np.array(
        [  # gamma ** k for the k rewards summed
            [0.125, 0.125, 0.25, 0.125],
            [0.125, 0.25, 0.5, 0.125],
            [0.125, 0.5, I, 0.125],
            [0.125, I, 0.125, 0.125],
            [0.25, 0.25, 0.25, 0.25],
            [0.5, 0.5, 0.5, 0.5],
        ],
        dtype=object,
    )
    exp_term = np.array(
        [[F, T_, F, F], [F, T_, F, F], [F, T_, I, F], [F, I, F, T_], [F, F, F, T_], [F, F, F, T_]], dtype=object
    )
    exp_next = np.array(
        [  # the obs row after the last summed step (truncation: the final obs row)
            [3, 3, 2, 3],
            [4, 3, 2, 4],
            [5, 3, I, 5],
            [6, I, 6, 6],
            [6, 6, 6, 6],
            [6, 6, 6, 6],
        ],
        dtype=object,
    )
    np.testing.assert_allclose(ret, exp_ret, rtol=0, atol=1e-6)
    for t in range(6):
        for i in range(4):
            if not valid[t, i]:
                continue
            assert disc[t, i] == pytest.approx(exp_disc[t, i]), (t, i)
            assert bool(term[t, i]) is exp_term[t, i], (t, i)
            assert int(nxt[t, i]) == exp_next[t, i], (t, i)


def test_n_step_targets_n1_is_one_step():
    rewards, terms, truncs, valid = _n_step_case()
    ret, disc, term, nxt = n_step_targets(rewards, terms, terms | truncs, valid, n=1, gamma=0.5)
    np.testing.assert_array_equal(ret, rewards * valid)
    np.testing.assert_array_equal(disc[valid], np.full(valid.sum(), 0.5, np.float32))
    np.testing.assert_array_equal(term[valid], terms[valid])
    np.testing.assert_array_equal(nxt, np.arange(1, 7)[:, None].repeat(4, axis=1))


def test_q_td_errors_hand_case():
    q_sa = np.array([1.0, 2.0, 0.5], np.float32)
    q_next = np.array([[1.0, 3.0], [4.0, 2.0], [10.0, 10.0]], np.float32)
    returns = np.array([0.5, 1.0, 2.0], np.float32)
    discounts = np.array([0.25, 0.5, 0.125], np.float32)
    terminated = np.array([False, False, True])
    td = q_td_errors(q_sa, q_next, returns, discounts, terminated)
    # 0.5 + .25*max(1,3) - 1 = 0.25 | 1 + .5*max(4,2) - 2 = 1.0 | terminated: 2 - 0.5 = 1.5 (q_next ignored)
    np.testing.assert_allclose(td, [0.25, 1.0, 1.5], atol=1e-7)
    # sign: the error is absolute (target below q_sa)
    assert q_td_errors(np.array([5.0]), np.array([[1.0, 0.0]]), np.array([1.0]), np.array([0.5]), np.array([False]))[
        0
    ] == pytest.approx(3.5)  # |1 + .5*1 - 5|


# ---- targets and loss -------------------------------------------------------------------
def test_q_targets_plain_vs_double():
    rewards = torch.tensor([1.0, 2.0, 0.5])
    discounts = torch.tensor([0.5, 0.25, 0.5])
    terms = torch.tensor([False, True, False])
    q_next_target = torch.tensor([[1.0, 5.0, 3.0], [2.0, 2.0, 2.0], [0.0, 4.0, 1.0]])
    q_next_online = torch.tensor([[0.0, 0.0, 9.0], [7.0, 0.0, 0.0], [0.0, 3.0, 1.0]])
    plain = q_targets(rewards, discounts, terms, q_next_target)
    double = q_targets(rewards, discounts, terms, q_next_target, q_next_online)
    # plain: 1 + .5*max(1,5,3)=3.5 | terminated: 2 | .5 + .5*4 = 2.5
    torch.testing.assert_close(plain, torch.tensor([3.5, 2.0, 2.5]))
    # double: online argmax 2 -> target's 3: 1 + .5*3 = 2.5 | 2 | online argmax 1 -> 4: 2.5 (same as plain)
    torch.testing.assert_close(double, torch.tensor([2.5, 2.0, 2.5]))


def _hand_module() -> QLearnerModule:
    """Q(s) = s (identity); Q_target(s) = [2 * s1, s0]."""
    q = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        q.weight.copy_(torch.eye(2))
    module = QLearnerModule(q)
    with torch.no_grad():
        module.target.weight.copy_(torch.tensor([[0.0, 2.0], [1.0, 0.0]]))
    return module


def _hand_batch(weights: bool = True) -> dict:
    batch = {
        Col.OBS: torch.tensor([[1.0, 2.0], [3.0, 0.5]]),
        Col.ACTIONS: torch.tensor([1, 0]),
        Col.NEXT_OBS: torch.tensor([[4.0, 1.0], [0.0, 2.0]]),
        Col.REWARDS: torch.tensor([0.5, 0.5]),
        Col.DISCOUNTS: torch.tensor([0.5, 0.25]),
        Col.TERMINATEDS: torch.tensor([False, False]),
    }
    if weights:
        batch[Col.WEIGHTS] = torch.tensor([2.0, 0.5])
    return batch


# q_sa = [Q(1,2)[1], Q(3,.5)[0]] = [2, 3]
# next: online Q = [[4,1],[0,2]] (argmax 0, 1); target Q = [[2*1, 4], [2*2, 0]] = [[2,4],[4,0]]
# double targets: .5 + .5*2 = 1.5, .5 + .25*0 = 0.5  -> td = [2-1.5, 3-.5] = [0.5, 2.5]
# plain targets:  .5 + .5*4 = 2.5, .5 + .25*4 = 1.5  -> td = [2-2.5, 3-1.5] = [-0.5, 1.5]
@pytest.mark.parametrize(
    "double_q, td_loss, weights, exp_loss, exp_td",
    [
        # 0.5*[.25, 6.25] = [.125, 3.125]; * [2, .5] = [.25, 1.5625]; mean 0.90625
        (True, "mse", True, 0.90625, [0.5, 2.5]),
        # huber(delta 1): .5*.5**2 = .125; 1*(2.5 - .5) = 2.0; * [2, .5] = [.25, 1.0]; mean 0.625
        (True, "huber", True, 0.625, [0.5, 2.5]),
        # unweighted mse: (.125 + 3.125) / 2 = 1.625
        (True, "mse", False, 1.625, [0.5, 2.5]),
        # plain max: 0.5*[.25, 2.25] = [.125, 1.125]; * [2, .5] = [.25, .5625]; mean 0.40625
        (False, "mse", True, 0.40625, [-0.5, 1.5]),
        # plain huber: [.125, 1*(1.5-.5)=1.0] * [2, .5] = [.25, .5]; mean 0.375
        (False, "huber", True, 0.375, [-0.5, 1.5]),
    ],
)
def test_dqn_loss_hand_network(double_q, td_loss, weights, exp_loss, exp_td):
    cfg = DQNConfig(env="CartPole-v1", double_q=double_q, td_loss=td_loss, huber_delta=1.0)
    module = _hand_module()
    loss, stats = DQNLoss.from_config(cfg)(module, _hand_batch(weights))
    assert float(loss.detach()) == pytest.approx(exp_loss, abs=1e-6)
    torch.testing.assert_close(stats["td_error"], torch.tensor(exp_td))
    assert float(stats["mean_q"]) == pytest.approx(2.5)  # (2 + 3) / 2
    assert float(stats["mean_td_error"]) == pytest.approx(np.mean(np.abs(exp_td)))
    loss.backward()
    assert module.q.weight.grad is not None and module.target.weight.grad is None


def test_dqn_loss_huber_delta():
    cfg = DQNConfig(env="CartPole-v1", double_q=True, td_loss="huber", huber_delta=2.0)
    loss, _ = DQNLoss.from_config(cfg)(_hand_module(), _hand_batch())
    # td [.5, 2.5]: .5*.25 = .125; 2*(2.5 - 1) = 3.0; * [2, .5] = [.25, 1.5]; mean 0.875
    assert float(loss.detach()) == pytest.approx(0.875, abs=1e-6)


def test_dqn_loss_gradient_matches_manual():
    """d loss / d W for Q(s) = W s with mse and weights: mean_i w_i * td_i * d q_sa_i / dW."""
    cfg = DQNConfig(env="CartPole-v1", double_q=True, td_loss="mse")
    module = _hand_module()
    loss, _ = DQNLoss.from_config(cfg)(module, _hand_batch())
    loss.backward()
    # row 0: action 1, obs (1,2): w*td = 2*.5 = 1 -> dW[1] += (1, 2)/2
    # row 1: action 0, obs (3,.5): w*td = .5*2.5 = 1.25 -> dW[0] += (3.75, .625)/2
    expected = torch.tensor([[1.875, 0.3125], [0.5, 1.0]])
    torch.testing.assert_close(module.q.weight.grad, expected)


# ---- target network ---------------------------------------------------------------------
def update_target(module: QLearnerModule, tau: float) -> None:
    """One refresh of ``module.target`` through the target-network mechanism (period 1)."""
    TargetNetwork(module.q, 1, tau=tau, net=module.target).post_update(1)


def test_update_target_copy_and_blend():
    q = nn.Linear(3, 2)
    module = QLearnerModule(q)
    assert all(not p.requires_grad for p in module.target.parameters())
    with torch.no_grad():
        for p in module.q.parameters():
            p.fill_(4.0)
        for p in module.target.parameters():
            p.fill_(0.0)
    update_target(module, 0.25)
    for p in module.target.parameters():  # 0.75 * 0 + 0.25 * 4 = 1
        torch.testing.assert_close(p, torch.full_like(p, 1.0))
    update_target(module, 0.25)
    for p in module.target.parameters():  # 0.75 * 1 + 0.25 * 4 = 1.75
        torch.testing.assert_close(p, torch.full_like(p, 1.75))
    for p in module.q.parameters():  # the online net is untouched
        torch.testing.assert_close(p, torch.full_like(p, 4.0))
    update_target(module, 1.0)
    for t, s in zip(module.target.parameters(), module.q.parameters()):
        assert torch.equal(t, s)
        assert not t.requires_grad


def test_update_target_copies_q_network_exactly():
    obs_space, act_space = gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(3)
    cfg = DQNConfig(env="CartPole-v1", model={"hiddens": [8]})
    module = QLearnerModule(build_q_network(obs_space, act_space, cfg.model, dueling=True))
    with torch.no_grad():
        for p in module.q.parameters():
            p.add_(1.0)
    assert not torch.equal(next(module.q.parameters()), next(module.target.parameters()))
    update_target(module, 1.0)
    sq, st = module.q.state_dict(), module.target.state_dict()
    assert sq.keys() == st.keys()
    for k in sq:
        assert torch.equal(sq[k], st[k]), k
    x = torch.randn(5, 4)
    assert torch.equal(module.q(x), module.target(x))


# ---- learn_on_replay_batch --------------------------------------------------------------
def _random_replay_batch(rng: np.random.Generator, n: int) -> Batch:
    return Batch(
        {
            Col.OBS: rng.normal(size=(n, 4)).astype(np.float32),
            Col.ACTIONS: rng.integers(0, 2, n),
            Col.REWARDS: rng.normal(size=n).astype(np.float32),
            Col.NEXT_OBS: rng.normal(size=(n, 4)).astype(np.float32),
            Col.TERMINATEDS: rng.random(n) < 0.3,
            Col.DISCOUNTS: np.full(n, 0.125, np.float32),
            Col.WEIGHTS: rng.uniform(0.5, 1.0, n).astype(np.float32),
            Col.INDICES: np.arange(n),
        }
    )


def test_learn_on_replay_batch_target_updates_and_priorities():
    cfg = DQNConfig(env="CartPole-v1", model={"hiddens": [16]}, target_network_update_freq=12, tau=1.0, lr=1e-2)
    torch.manual_seed(0)
    policy = QPolicyLearner(cfg, gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    learner, target_net = policy.learner, policy.target
    module = learner.module
    rng = np.random.default_rng(0)

    def same_as_online() -> bool:
        return all(torch.equal(a, b) for a, b in zip(module.q.parameters(), module.target.parameters()))

    # batches of 4 rows, updates every 12 trained steps: after calls 3 and 6
    for call in range(1, 8):
        batch = _random_replay_batch(rng, 4)
        with torch.no_grad():  # the TD error the update will see, from the weights before it
            t = batch.to_torch(exclude=(Col.INDICES,))
            q_sa = module.q(t[Col.OBS]).gather(1, t[Col.ACTIONS].long().unsqueeze(1)).squeeze(1)
            target = q_targets(
                t[Col.REWARDS],
                t[Col.DISCOUNTS],
                t[Col.TERMINATEDS],
                module.target(t[Col.NEXT_OBS]),
                module.q(t[Col.NEXT_OBS]),
            )
            expected_prio = (q_sa - target).abs().numpy()
        prio, stats = learn_on_replay_batch(learner, batch)
        np.testing.assert_allclose(prio, expected_prio, rtol=1e-5, atol=1e-6)
        assert prio.shape == (4,) and (prio >= 0).all()
        assert stats["mean_td_error"] == pytest.approx(float(expected_prio.mean()), rel=1e-5)
        assert all(isinstance(v, float) for v in stats.values())
        updates = call // 3
        assert target_net.num_updates == updates, call
        assert target_net.since_update == 4 * (call % 3), call
        # the target equals the online net exactly right after an update, and only then
        assert same_as_online() == (call % 3 == 0), call
    assert learner.num_updates == 7


def test_learn_on_replay_batch_soft_update_blends():
    cfg = DQNConfig(env="CartPole-v1", model={"hiddens": [8]}, target_network_update_freq=4, tau=0.25, lr=1e-2)
    policy = QPolicyLearner(cfg, gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    learner, target = policy.learner, policy.target
    before = copy.deepcopy(learner.module.target.state_dict())
    learn_on_replay_batch(learner, _random_replay_batch(np.random.default_rng(1), 4))
    assert target.num_updates == 1
    online = learner.module.q.state_dict()
    for k, v in learner.module.target.state_dict().items():
        torch.testing.assert_close(v, 0.75 * before[k] + 0.25 * online[k])


# ---- epsilon ----------------------------------------------------------------------------
def test_apex_epsilon_values():
    assert apex_epsilon(0, 3) == pytest.approx(0.4)  # 0.4 ** (1 + 7*0/2)
    assert apex_epsilon(1, 3) == pytest.approx(0.4**4.5)  # 0.4 ** (1 + 7/2) ~= 0.01619
    assert apex_epsilon(1, 3) == pytest.approx(0.016190, abs=1e-6)
    assert apex_epsilon(2, 3) == pytest.approx(0.4**8)  # 0.4 ** (1 + 14/2) ~= 0.000655
    assert apex_epsilon(2, 3) == pytest.approx(0.00065536, abs=1e-9)
    assert apex_epsilon(0, 1) == pytest.approx(0.4)  # a single actor explores with the base
    assert apex_epsilon(0, 2, base=0.5, alpha=1.0) == pytest.approx(0.5)
    assert apex_epsilon(1, 2, base=0.5, alpha=1.0) == pytest.approx(0.25)  # 0.5 ** (1 + 1)


def test_apex_runner_epsilons_per_worker():
    cfg = ApeXConfig(
        env="CartPole-v1", seed=0, model={"hiddens": [8]}, resources={"num_workers": 3, "num_envs_per_worker": 1}
    )
    post = functools.partial(n_step_postprocess, n_step=cfg.n_step, gamma=cfg.gamma, priorities=True)
    expected = {1: 0.4, 2: 0.4**4.5, 3: 0.4**8}
    for i, eps in expected.items():
        runner = ApeXRunner(cfg, i, EpsilonGreedyQPolicy, post, 8)
        try:
            assert runner.policy.epsilon == pytest.approx(eps)
            runner.set_global_vars({"env_steps": 10_000})  # Ape-X's epsilon is fixed per actor
            assert runner.policy.epsilon == pytest.approx(eps)
        finally:
            runner.stop()


def test_apex_runner_driver_spreads_epsilon_over_envs():
    cfg = ApeXConfig(
        env="CartPole-v1", seed=0, model={"hiddens": [8]}, resources={"num_workers": 0, "num_envs_per_worker": 4}
    )
    post = functools.partial(n_step_postprocess, n_step=3, gamma=0.5, priorities=True)
    runner = ApeXRunner(cfg, 0, EpsilonGreedyQPolicy, post, 8)
    try:
        # 0.4 ** (1 + 7 j / 3) for j = 0..3
        np.testing.assert_allclose(runner.policy.epsilon, [0.4, 0.4 ** (10 / 3), 0.4 ** (17 / 3), 0.4**8])
        shard = ReplayShard(100, prioritized=True, seed=0)
        runner.set_shards([shard])
        metrics = runner.sample_into_replay()
        assert len(shard) == metrics.env_steps > 0  # every valid step, with its worker-side priority
    finally:
        runner.stop()


def test_apex_small_machine_preset_validates():
    cfg = ApeXConfig(env="CartPole-v1", **ApeXConfig.small_machine_preset())
    assert cfg.learning_starts <= cfg.replay_capacity
    assert cfg.resources.num_replay_shards == 2
    assert cfg.epsilon_schedule() is None


def test_dqn_iterations_sample_a_thousand_steps_and_report_epsilon():
    cfg = DQNConfig(
        env="CartPole-v1",
        exploration_initial_eps=1.0,
        exploration_final_eps=0.1,
        exploration_timesteps=4000,
        learning_starts=500,
        model={"hiddens": [8]},
        seed=0,
        resources={"num_workers": 0, "num_envs_per_worker": 2},
    )
    with cfg.build() as algo:
        first, second = algo.train(), algo.train()
        for r in (first, second):
            assert r["epsilon"] == pytest.approx(max(0.1, 1.0 - 0.9 * r["env_steps_sampled"] / 4000))
        assert 1000 <= first["env_steps_sampled"] < 1000 + 2 * cfg.fragment_length()  # one step past 1,000 at most
        assert second["env_steps_sampled"] - first["env_steps_sampled"] >= 1000
        assert ("epsilon", "epsilon") in algo.display_metrics()


def test_dqn_epsilon_schedule_anneals_linearly():
    cfg = DQNConfig(
        env="CartPole-v1",
        exploration_initial_eps=1.0,
        exploration_final_eps=0.1,
        exploration_timesteps=1000,
        model={"hiddens": [8]},
    )
    assert cfg.epsilon_schedule() == [(0, 1.0), (1000, 0.1)]
    policy = EpsilonGreedyQPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), cfg, seed=0)
    assert policy.epsilon == pytest.approx(1.0)
    policy.on_global_vars({"env_steps": 500})
    assert policy.epsilon == pytest.approx(0.55)  # 1 + 0.5 * (0.1 - 1)
    policy.on_global_vars({"env_steps": 250})
    assert policy.epsilon == pytest.approx(0.775)  # 1 + 0.25 * (0.1 - 1)
    policy.on_global_vars({"env_steps": 5000})
    assert policy.epsilon == pytest.approx(0.1)  # flat past the end
    policy.on_global_vars({"something_else": 1})
    assert policy.epsilon == pytest.approx(0.1)


def test_epsilon_greedy_action_frequencies():
    cfg = DQNConfig(env="CartPole-v1", model={"hiddens": [8]})
    policy = EpsilonGreedyQPolicy(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(4), cfg, seed=0)
    obs = np.random.default_rng(0).normal(size=(4000, 3)).astype(np.float32)
    with torch.no_grad():
        greedy = policy.module(torch.from_numpy(obs)).numpy().argmax(1)
        policy.epsilon = 0.0
        actions, extras = policy.act(obs)
        np.testing.assert_array_equal(actions, greedy)
        np.testing.assert_allclose(extras[Col.Q_VALUES].argmax(1), greedy)
        policy.epsilon = 1.0
        actions, _ = policy.act(obs)
        freq = np.bincount(actions, minlength=4) / len(actions)
        np.testing.assert_allclose(freq, 0.25, atol=0.03)  # sd of each share ~0.007
        policy.epsilon = 0.5
        actions, _ = policy.act(obs)
        # greedy with prob .5 + .5 * 1/4 = 0.625
        assert np.mean(actions == greedy) == pytest.approx(0.625, abs=0.03)
        actions, _ = policy.act(obs, explore=False)
        np.testing.assert_array_equal(actions, greedy)


# ---- worker-side n-step postprocessing on a real fragment -------------------------------
def test_n_step_postprocess_real_fragment():
    cfg = DQNConfig(
        env="CartPole-v1", gamma=0.5, n_step=3, seed=0, model={"hiddens": [16]}, resources={"num_envs_per_worker": 2}
    )
    fragments = []

    def post(fragment):
        fragments.append(fragment)
        return n_step_postprocess(fragment, n_step=3, gamma=0.5, priorities=True)

    runner = EnvRunner(cfg, 0, EpsilonGreedyQPolicy, post, 40)
    try:
        batch, metrics = runner.sample()
        frag = fragments[0]
        T, N = frag.rewards.shape
        assert (T, N) == (40, 2)
        dones = frag.terminateds | frag.truncateds
        assert dones.any() and (~frag.valid).any()  # random CartPole episodes end inside 40 steps
        assert len(batch) == int(frag.valid.sum()) == metrics.env_steps
        for col in (Col.OBS, Col.ACTIONS, Col.REWARDS, Col.NEXT_OBS, Col.TERMINATEDS, Col.DISCOUNTS, Col.PRIORITIES):
            assert col in batch

        row = 0
        far_rows = 0
        for i in range(N):  # flatten_valid keeps each env's valid steps contiguous and in order
            for t in range(T):
                if not frag.valid[t, i]:
                    continue
                np.testing.assert_array_equal(batch[Col.OBS][row], frag.obs[t, i])
                # scalar reference: sum until the episode or the fragment ends, at most 3 rewards
                ret, k, last = 0.0, 0, t
                for j in range(t, min(t + 3, T)):
                    ret += 0.5**k * frag.rewards[j, i]
                    k, last = k + 1, j
                    if dones[j, i]:
                        break
                assert batch[Col.REWARDS][row] == pytest.approx(ret)
                assert batch[Col.DISCOUNTS][row] == pytest.approx(0.5**k)
                assert bool(batch[Col.TERMINATEDS][row]) == bool(frag.terminateds[last, i])
                np.testing.assert_array_equal(batch[Col.NEXT_OBS][row], frag.obs[last + 1, i])
                if t + 3 <= T and not dones[t : t + 3, i].any():
                    far_rows += 1  # not near an episode end: the observation 3 steps later, same env
                    np.testing.assert_array_equal(batch[Col.NEXT_OBS][row], frag.obs[t + 3, i])
                    assert batch[Col.REWARDS][row] == pytest.approx(1.75)  # CartPole: 1 + .5 + .25
                row += 1
        assert row == len(batch) and far_rows > 0

        prio = batch[Col.PRIORITIES]
        assert (prio >= 0).all()
        with torch.no_grad():
            q = runner.policy.module(torch.from_numpy(batch[Col.OBS])).numpy()
            q_next = runner.policy.module(torch.from_numpy(batch[Col.NEXT_OBS])).numpy()
        q_sa = q[np.arange(len(batch)), batch[Col.ACTIONS].astype(np.int64)]
        expected = q_td_errors(q_sa, q_next, batch[Col.REWARDS], batch[Col.DISCOUNTS], batch[Col.TERMINATEDS])
        np.testing.assert_allclose(prio, expected, rtol=1e-5, atol=1e-6)
    finally:
        runner.stop()


# ---- config -----------------------------------------------------------------------------
def test_beta_annealing():
    cfg = DQNConfig(
        env="CartPole-v1", prioritized_replay_beta=0.4, final_prioritized_replay_beta=1.0, beta_annealing_steps=1000
    )
    assert cfg.beta(0) == pytest.approx(0.4)
    assert cfg.beta(500) == pytest.approx(0.7)  # 0.4 + 0.5 * (1 - 0.4)
    assert cfg.beta(1000) == pytest.approx(1.0)
    assert cfg.beta(10_000) == pytest.approx(1.0)
    # Ape-X keeps beta fixed by default
    apex = ApeXConfig(env="CartPole-v1")
    assert apex.beta(0) == pytest.approx(0.4) and apex.beta(10**9) == pytest.approx(0.4)


def test_config_errors():
    with pytest.raises(ConfigError, match="learning_starts"):
        DQNConfig(env="CartPole-v1", learning_starts=100, replay_capacity=50)
    with pytest.raises(ConfigError, match="learning_start"):
        DQNConfig(env="CartPole-v1", learning_start=5)
    with pytest.raises(ConfigError, match="td_loss"):
        DQNConfig(env="CartPole-v1", td_loss="l1")
    with pytest.raises(ConfigError, match="tau"):
        DQNConfig(env="CartPole-v1", tau=0.0)


def test_dqn_rejects_continuous_actions():
    cfg = DQNConfig(env="Pendulum-v1", learning_starts=10, resources={"num_envs_per_worker": 1})
    with pytest.raises(ConfigError, match="Discrete"):
        algo = cfg.build()
        algo.stop()


# ---- in-process DQN smoke ---------------------------------------------------------------
def test_dqn_smoke_and_checkpoint_with_replay(tmp_path):
    cfg = DQNConfig(
        env="CartPole-v1",
        learning_starts=200,
        min_env_steps_per_iteration=256,
        seed=0,
        train_batch_size=32,
        training_intensity=2.0,
        target_network_update_freq=256,
        checkpoint_replay=True,
        model={"hiddens": [32, 32]},
        resources={"num_envs_per_worker": 8},
    )
    algo = cfg.build()
    algo2 = None
    try:
        sizes = []
        for _ in range(3):
            r = algo.train()
            sizes.append(r["replay_size"])
            sampled, trained = r["env_steps_sampled"], r["env_steps_trained"]
            # every valid step becomes one n-step transition in replay (capacity not reached)
            assert r["replay_size"] == sampled
            # intensity 2: trained ~ 2 * (steps sampled since learning began), in whole batches of 32;
            # the first learning call also credits the steps it sampled below learning_starts (<= 128)
            assert trained % 32 == 0
            assert 2 * (sampled - 200) - 32 < trained <= 2 * (sampled - 200 + 128)
            # the target net was refreshed every 256 trained steps (32 divides 256: no remainder lost)
            assert r["num_target_updates"] == trained // 256
        assert sizes[0] < sizes[1] < sizes[2]
        assert r["env_steps_trained"] > 0 and np.isfinite(r["learner/loss"])

        path = algo.save(tmp_path / "ckpt")
        algo2 = DQN.from_checkpoint(path)
        assert algo2.replay.stats()["size"] == algo.replay.stats()["size"] == sizes[-1]
        s1, s2 = algo.replay.get_state()["buffer"], algo2.replay.get_state()["buffer"]
        assert s1.keys() == s2.keys()
        assert algo2.counters == algo.counters and (algo2.target.since_update, algo2.target.num_updates) == (
            algo.target.since_update,
            algo.target.num_updates,
        )
        w1, w2 = algo.learner.module.state_dict(), algo2.learner.module.state_dict()  # online and target
        assert w1.keys() == w2.keys()
        for k in w1:
            assert torch.equal(w1[k], w2[k]), k
        runner = algo2.env_runners.actors[0]
        for k, v in algo.get_weights().items():  # the restored runner acts with the restored weights
            np.testing.assert_array_equal(runner.get_weights()[k], v)
        # the restored runner follows the epsilon schedule from the restored step count (1 -> 0.02 over 10k)
        assert runner.policy.epsilon == pytest.approx(1.0 - 0.98 * algo.counters["env_steps_sampled"] / 10_000)
        r2 = algo2.train()
        assert r2["iteration"] == 4 and r2["env_steps_sampled"] > sampled
    finally:
        algo.stop()
        if algo2 is not None:
            algo2.stop()
