"""MultiDiscrete and MultiBinary actions: log-probabilities, entropies and KLs against
hand-computed values, sampling frequencies, the env's ``start``, the exported greedy action,
and PPO learning each on a small env (tests/space_envs.py)."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from shoal import PPOConfig
from shoal.errors import EnvError
from shoal.models.distributions import Bernoulli, MultiCategorical, dist_class_for, to_env_actions


def test_multi_categorical_hand_values():
    cls = dist_class_for(gym.spaces.MultiDiscrete([2, 3]))
    assert issubclass(cls, MultiCategorical) and cls.nvec == (2, 3) and cls.num_inputs(None) == 5
    assert dist_class_for(gym.spaces.MultiDiscrete([2, 3])) is cls  # one class per nvec
    # component 0: logits (0, log 3) -> p = (1/4, 3/4); component 1: uniform over 3
    logits = torch.tensor([[0.0, math.log(3.0), 0.0, 0.0, 0.0]])
    d = cls(logits)
    assert d.logp(torch.tensor([[1, 2]])).item() == pytest.approx(math.log(0.75) + math.log(1 / 3), abs=1e-6)
    assert d.logp(torch.tensor([[0, 0]])).item() == pytest.approx(math.log(0.25) + math.log(1 / 3), abs=1e-6)
    h0 = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert d.entropy().item() == pytest.approx(h0 + math.log(3), abs=1e-6)
    assert d.deterministic().tolist() == [[1, 0]]
    # KL against uniform on both components: only component 0 differs
    u = cls(torch.zeros(1, 5))
    assert d.kl(u).item() == pytest.approx(0.25 * math.log(0.5) + 0.75 * math.log(1.5), abs=1e-6)
    # sampling frequencies follow the probabilities, per component
    g = torch.Generator().manual_seed(0)
    s = cls(logits.expand(20000, 5)).sample(g)
    assert s.shape == (20000, 2) and s[:, 0].float().mean().item() == pytest.approx(0.75, abs=0.015)
    assert np.bincount(s[:, 1].numpy(), minlength=3) / 20000 == pytest.approx([1 / 3] * 3, abs=0.015)


def test_bernoulli_hand_values():
    assert dist_class_for(gym.spaces.MultiBinary(3)) is Bernoulli
    logits = torch.tensor([[0.0, math.log(3.0)]])  # P(1) = 1/2 and 3/4
    d = Bernoulli(logits)
    assert d.logp(torch.tensor([[1.0, 0.0]])).item() == pytest.approx(math.log(0.5) + math.log(0.25), abs=1e-6)
    h = math.log(2) - (0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert d.entropy().item() == pytest.approx(h, abs=1e-6)
    assert d.deterministic().tolist() == [[0.0, 1.0]]  # logit 0 is not > 0
    other = Bernoulli(torch.zeros(1, 2))
    kl = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
    assert d.kl(other).item() == pytest.approx(kl, abs=1e-6)
    s = Bernoulli(logits.expand(20000, 2)).sample(torch.Generator().manual_seed(1))
    assert s.mean(0).tolist() == pytest.approx([0.5, 0.75], abs=0.015)


def test_env_actions_shift_by_start_and_cast():
    md = gym.spaces.MultiDiscrete([3, 3], start=[1, -1])
    assert to_env_actions(md, np.array([[0, 0], [2, 2]])).tolist() == [[1, -1], [3, 1]]
    assert to_env_actions(gym.spaces.Discrete(4, start=2), np.array([0, 3])).tolist() == [2, 5]
    bits = to_env_actions(gym.spaces.MultiBinary(2), np.array([[1.0, 0.0]], np.float32))
    assert bits.dtype == np.int8 and bits.tolist() == [[1, 0]]


def test_unsupported_action_space_names_what_is():
    with pytest.raises(
        EnvError, match="(?s)MultiDiscrete.*is not supported; use Discrete, a 1-D Box, a 1-D MultiDiscrete"
    ):
        dist_class_for(gym.spaces.MultiDiscrete([[2, 2], [2, 2]]))
    with pytest.raises(EnvError, match="MultiBinary"):
        dist_class_for(gym.spaces.MultiBinary([2, 2]))


@pytest.mark.learning
@pytest.mark.parametrize(
    "env, random_return, target", [("space_envs:MultiSignal", 6.7, 17.0), ("space_envs:BitSignal", 20.0, 36.0)]
)
def test_ppo_learns_multi_discrete_and_multi_binary(env, random_return, target, tmp_path):
    """Random play scores ``random_return`` per 10-step episode, a perfect policy 20 (MultiSignal)
    or 40 (BitSignal); PPO passes ``target`` within 60k env steps in-process."""
    import shoal

    cfg = PPOConfig(env=env, seed=0, lr=3e-3, train_batch_size=1000, minibatch_size=250, num_sgd_iter=4)
    algo = cfg.build()
    try:
        best = -math.inf
        r: dict = {}
        while r.get("env_steps_sampled", 0) < 60_000:
            r = algo.train()
            best = max(best, r["episode_return_mean"])
            if best >= target:
                break
        assert best >= target, f"{env}: best mean return {best:.1f} (random {random_return})"
        path = algo.save(tmp_path / "ckpt")
    finally:
        algo.stop()
    with shoal.load_policy(path) as policy:  # the env checks every action's range and dtype
        obs = np.eye(6, dtype=np.float32)[[0, 3]].sum(0) if "Multi" in env else np.array([1, 0, 1, 0], np.float32)
        action, _ = policy.predict(obs, deterministic=True)
    if "Multi" in env:
        assert action.tolist() == [1, 1]  # targets (0, 0), numbered from start 1
    else:
        assert action.tolist() == [1, 0, 1, 0] and action.dtype == np.int8
