"""``episode_window``: how many finished episodes ``episode_return_mean`` (and stop.reward) average."""

from __future__ import annotations

import pytest

from shoal import PPOConfig
from shoal.algorithms.apex_td3 import ApeXTD3Config
from shoal.algorithms.sac import SACConfig
from shoal.errors import ConfigError


def test_the_mean_return_averages_the_configured_window():
    cfg = PPOConfig(env="CartPole-v1", train_batch_size=256, minibatch_size=128, episode_window=3, seed=0)
    with cfg.build() as algo:
        r = algo.train()
        returns = list(algo.episodes.returns)
        assert len(returns) == 3 and r["episodes_total"] > 3  # older episodes left the window
        assert r["episode_return_mean"] == pytest.approx(sum(returns) / 3)
        state = algo.get_state()
    with cfg.copy_with(episode_window=2).build() as smaller:  # a smaller window keeps the newest episodes
        smaller.set_state(state)
        assert list(smaller.episodes.returns) == returns[-2:]


def test_defaults_and_bounds():
    assert PPOConfig(env="CartPole-v1").episode_window == 100
    assert SACConfig(env="Pendulum-v1").episode_window == 20  # long continuous-control episodes
    assert ApeXTD3Config(env="Pendulum-v1").episode_window == 20
    with pytest.raises((ConfigError, ValueError), match="episode_window"):
        PPOConfig(env="CartPole-v1", episode_window=0)
