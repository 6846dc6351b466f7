"""Single-agent action masks: read from info["action_mask"] or a Dict observation's entry, honoured
in sampling, in the losses, in Q-learning's targets, in evaluation and in predict."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import trains_within
from space_envs import MaskedSignal

from shoal import APPOConfig, DQNConfig, IMPALAConfig, PPOConfig
from shoal.batch import Col
from shoal.errors import EnvError
from shoal.spaces import action_masks, flat_obs_dim, preprocess_obs


def test_masks_from_info_rows_absent_are_all_legal_and_empty_rows_too():
    info = {"action_mask": np.array([[1, 0, 1], [0, 0, 0], [0, 0, 0]], np.int8), "_action_mask": [True, False, True]}
    got = action_masks(gym.spaces.Box(0, 1, (2,)), np.zeros((3, 2)), info, 3, 3)
    # row 1 has no mask this step (all legal); row 2 has none legal (a final position: all legal, never learned from)
    np.testing.assert_array_equal(got, [[True, False, True], [True, True, True], [True, True, True]])
    no_info = action_masks(gym.spaces.Box(0, 1, (2,)), np.zeros((2, 2)), {}, 2, 3)
    assert no_info.shape == (2, 3) and no_info.all()
    with pytest.raises(EnvError, match=r"shape \(4,\) per env; its action space needs \(3,\)"):
        action_masks(gym.spaces.Box(0, 1, (2,)), np.zeros((1, 2)), {"action_mask": np.ones((1, 4))}, 1, 3)


def test_dict_mask_entry_is_read_as_the_mask_not_as_a_feature():
    space = MaskedSignal(in_obs=True).observation_space
    assert flat_obs_dim(space) == 4  # the signal only
    obs = {"signal": np.eye(4, dtype=np.float32)[[2]], "action_mask": np.array([[0, 1, 1, 0]], np.int8)}
    np.testing.assert_array_equal(preprocess_obs(space, obs), [[0, 0, 1, 0]])
    np.testing.assert_array_equal(action_masks(space, obs, {}, 1, 4), [[False, True, True, False]])


def test_masked_categorical_log_probs_match_hand_values():
    from shoal.learn.masking import ActionMasked
    from shoal.models.distributions import Categorical

    class Module:
        dist_cls = Categorical

        def __call__(self, obs):
            return torch.log(torch.tensor([[1.0, 2.0, 3.0, 4.0]])).expand(len(obs), 4), torch.zeros(len(obs))

    masked = ActionMasked(Module(), torch.tensor([[True, False, True, False], [False, False, False, True]]))
    logits, _ = masked(torch.zeros(2, 1))
    dist = Categorical(logits)
    # legal {0, 2} with weights 1 and 3: p = 1/4 and 3/4; a lone legal action has probability 1
    np.testing.assert_allclose(dist.logp(torch.tensor([0, 3])).numpy(), [np.log(0.25), 0.0], atol=1e-6)
    np.testing.assert_allclose(dist.logp(torch.tensor([2, 3])).numpy(), [np.log(0.75), 0.0], atol=1e-6)
    np.testing.assert_allclose(dist.entropy().numpy(), [-(0.25 * np.log(0.25) + 0.75 * np.log(0.75)), 0.0], atol=1e-6)


def test_epsilon_greedy_acts_among_legal_actions_only():
    from shoal.rollout.policies import EpsilonGreedyQPolicy

    cfg = DQNConfig(env="CartPole-v1")
    policy = EpsilonGreedyQPolicy(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(4), cfg, seed=0, epsilon=1.0)
    masks = np.zeros((2000, 4), bool)
    masks[:1000, [1, 3]] = True
    masks[1000:, 2] = True
    actions, _ = policy.act(np.zeros((2000, 4), np.float32), explore=True, masks=masks)
    assert set(actions[:1000]) == {1, 3} and (actions[1000:] == 2).all()
    assert 0.4 < (actions[:1000] == 1).mean() < 0.6  # uniform among the legal ones
    policy.module = lambda obs: torch.tensor([[9.0, 1.0, 2.0, 3.0]]).expand(len(obs), 4)
    greedy, _ = policy.act(np.zeros((1, 4), np.float32), explore=False, masks=np.array([[False, True, True, False]]))
    assert greedy[0] == 2  # the best of the legal ones (action 0 scores best but is illegal)


def test_q_targets_max_over_the_next_legal_actions():
    from shoal.algorithms.dqn import q_targets

    q_next = torch.tensor([[5.0, 1.0, 2.0], [0.0, 7.0, 3.0]])
    mask = torch.tensor([[False, True, True], [True, True, True]])
    r, disc, term = torch.tensor([1.0, 1.0]), torch.tensor([0.5, 0.5]), torch.tensor([False, True])
    # row 0: max over {1, 2} = 2 -> 1 + 0.5 * 2; row 1 terminated -> 1
    np.testing.assert_allclose(q_targets(r, disc, term, q_next, None, mask).numpy(), [2.0, 1.0])
    # double Q: the online net picks action 2 among the legal ones (action 0 is better but illegal)
    online = torch.tensor([[9.0, 1.0, 4.0], [0.0, 0.0, 0.0]])
    np.testing.assert_allclose(q_targets(r, disc, term, q_next, online, mask).numpy(), [2.0, 1.0])
    np.testing.assert_allclose(q_targets(r, disc, term, q_next, online).numpy(), [3.5, 1.0])


@pytest.mark.parametrize("in_obs", [False, True], ids=["info", "dict-entry"])
def test_ppo_samples_and_learns_under_masks(in_obs):
    MaskedSignal.illegal = 0
    algo = PPOConfig(
        env=MaskedSignal,
        env_config={"in_obs": in_obs},
        seed=0,
        train_batch_size=512,
        minibatch_size=128,
        num_sgd_iter=4,
        lr=3e-3,
        resources={"num_envs_per_worker": 4},
    ).build()
    try:
        batch, _ = algo.env_runners.actors[0].sample()
        assert batch[Col.ACTION_MASK].shape == (len(batch), 4) and batch[Col.ACTION_MASK].sum(1).max() == 2
        for _ in range(12):
            result = algo.train()
        assert MaskedSignal.illegal == 0
        # legal choices alone give 8 a 16-step episode at random; the target every step gives 16
        assert result["episode_return_mean"] > 13.0, result["episode_return_mean"]
        ev = algo.evaluate(4)
        assert ev["episode_return_mean"] > 13.0 and MaskedSignal.illegal == 0
        obs, info = MaskedSignal(in_obs=in_obs).reset(seed=3)
        mask = None if in_obs else info["action_mask"]
        action, _ = algo.predict(obs, action_mask=mask)
        legal = (obs["action_mask"] if in_obs else info["action_mask"]).astype(bool)
        assert legal[int(action)]
    finally:
        algo.stop()


def test_predict_never_picks_an_illegal_action_even_when_it_scores_best():
    algo = PPOConfig(env=MaskedSignal, seed=0, resources={"num_envs_per_worker": 2}).build()
    try:
        obs = np.eye(4, dtype=np.float32)[[0, 0, 0]]
        masks = np.array([[0, 1, 0, 0], [0, 0, 1, 1], [1, 1, 1, 1]])
        for deterministic in (True, False):
            actions, _ = algo.predict(obs, action_mask=masks, deterministic=deterministic)
            assert actions[0] == 1 and actions[1] in (2, 3)
    finally:
        algo.stop()


@pytest.mark.parametrize("algo_cls", [PPOConfig, IMPALAConfig])
def test_losses_see_the_masks_the_actions_were_sampled_under(algo_cls):
    from shoal.algorithms.impala import IMPALALoss
    from shoal.algorithms.ppo_loss import PPOLoss

    algo = algo_cls(env=MaskedSignal, seed=0, resources={"num_envs_per_worker": 2}).build()
    try:
        runner = algo.env_runners.actors[0]
        t = runner.sample()[0].to_torch()
        loss = (PPOLoss if algo_cls is PPOConfig else IMPALALoss).from_config(algo.config)
        without = {k: v for k, v in t.items() if k != Col.ACTION_MASK}
        _, masked = loss(runner.policy.module, t)
        _, unmasked = loss(runner.policy.module, without)
        if algo_cls is PPOConfig:  # the sampling network itself: ratio 1 under the masks
            assert float(masked["kl"]) < 1e-5 and float(unmasked["kl"]) > 0.05
        else:  # V-trace's importance weights: 1 under the masks, about 1/2 without (2 of 4 actions legal)
            assert float(masked["mean_rho"]) == pytest.approx(1.0, abs=1e-5) and float(unmasked["mean_rho"]) < 0.8
    finally:
        algo.stop()


def test_dqn_impala_and_recurrent_policies_run_under_masks():
    MaskedSignal.illegal = 0
    dqn = DQNConfig(
        env=MaskedSignal, env_config={"in_obs": True}, seed=0, learning_starts=64, min_env_steps_per_iteration=256
    ).build()
    try:
        for _ in range(2):
            dqn.train()
        batch = dqn.replay.sample(32)
        assert batch[Col.NEXT_ACTION_MASK].shape == (32, 4)
    finally:
        dqn.stop()
    for cfg in (
        IMPALAConfig(env=MaskedSignal, seed=0, resources={"num_envs_per_worker": 2}),
        APPOConfig(env=MaskedSignal, seed=0, model={"use_lstm": True}, resources={"num_envs_per_worker": 2}),
        PPOConfig(env=MaskedSignal, seed=0, model={"use_lstm": True, "max_seq_len": 8}, train_batch_size=256),
    ):
        algo = cfg.build()
        try:
            assert trains_within(algo) > 0
            assert algo.evaluate(2)["num_episodes"] == 2
        finally:
            algo.stop()
    assert MaskedSignal.illegal == 0


def test_masks_for_an_action_space_they_cannot_apply_to_are_refused():
    class BoxMasked(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (2,))
        action_space = gym.spaces.Box(-1, 1, (1,))

        def reset(self, *, seed=None, options=None):
            return np.zeros(2, np.float32), {"action_mask": np.ones(1, np.int8)}

        def step(self, action):
            return np.zeros(2, np.float32), 0.0, False, False, {}

    with pytest.raises(EnvError, match=r"action masks \(info\['action_mask'\]\).*Box.*Discrete and MultiDiscrete"):
        PPOConfig(env=BoxMasked).build()
