"""A league policy's parameter average (``average_tau``) and the magnet (``magnet_coeff``): the
PolicyLearner keeps an exponential moving average of the policy's parameters; with the magnet,
APPO's loss adds KL(pi || average). The loadable ``main@average`` policy is the one whose
exploitability a run reports."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shoal.algorithms.alpha_star import AlphaStarConfig
from shoal.algorithms.alpha_star_learner import APPOPolicyLearner
from shoal.algorithms.appo import APPOConfig
from shoal.algorithms.impala import IMPALAConfig
from shoal.batch import Col
from shoal.errors import ConfigError
from shoal.learn.learner_params import LearnerParams
from shoal.learn.sequences import time_major
from shoal.models.distributions import masked_logits
from shoal.replay import BatchReplay
from shoal.rollout.multi_agent import MultiAgentEnvRunner

torch.set_num_threads(1)
TTT = "pettingzoo.classic:tictactoe_v3"


def small(**kw) -> AlphaStarConfig:
    base = dict(
        env=TTT,
        seed=0,
        rollout_fragment_length=8,
        train_batch_size=64,
        min_time_s_per_iteration=0.0,
        league="no_league",
        max_num_policies_to_train=1,
        model={"hiddens": [32]},
        average_tau=0.25,
        magnet_coeff=0.5,
    )
    cfg = AlphaStarConfig(**{**base, **kw})
    cfg.resources.num_envs_per_worker = 8
    return cfg


def ttt_batch():
    """Tic-tac-toe fragments of one policy, with action masks, and the player's spaces."""
    cfg = small()
    runner = MultiAgentEnvRunner(cfg, 0, {"main": None}, ticks_per_sample=24)
    batch = runner.sample()[0]["main"]
    env = runner.envs[0]
    spaces = env.observation_space("player_1"), env.action_space("player_1")
    return batch, spaces


@pytest.fixture(scope="module")
def league_batch():
    return ttt_batch()


def make_learner(cfg, spaces, replay=None):
    return APPOPolicyLearner("main", replay or BatchReplay(capacity=4), cfg, *spaces)


def perturb(module: torch.nn.Module, scale: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


def test_the_keys_reach_the_learner_record_and_are_checked():
    params = LearnerParams.from_config(small())
    assert (params.average_tau, params.magnet_coeff) == (0.25, 0.5)
    assert LearnerParams.from_config(AlphaStarConfig(env=TTT)).average_tau == 0.002  # kept by default
    assert LearnerParams.from_config(AlphaStarConfig(env=TTT, average_tau=None)).average_tau is None
    assert LearnerParams.from_config(APPOConfig(env="CartPole-v1")).average_tau is None  # no such key: off
    with pytest.raises(ConfigError, match="magnet_coeff"):
        small(magnet_coeff=-0.1)
    with pytest.raises(ConfigError, match="average_tau"):
        small(average_tau=0.0)
    with pytest.raises(ConfigError, match="average_tau"):
        small(average_tau=1.5)
    with pytest.raises(ConfigError, match="average_policy is None"):
        small(average_tau=None)  # a magnet with nothing to pull towards (average_tau: null, as written before)
    for cls in (APPOConfig, IMPALAConfig):  # their losses keep no average: refused, not ignored
        with pytest.raises(ConfigError, match="average_tau"):
            cls(env="CartPole-v1", average_tau=0.01)


def test_an_average_without_a_magnet_adds_no_term(league_batch):
    batch, spaces = league_batch
    learner = make_learner(small(magnet_coeff=0.0), spaces)
    assert learner.average is not None and learner.learner.loss_fn.magnet is None
    _, stats = learner.learner.loss_fn(learner.learner.module, batch.to_torch())
    assert "magnet_kl" not in stats
    assert make_learner(small(average_tau=None, magnet_coeff=0.0), spaces).average is None


def test_the_magnet_term_is_kl_from_the_policy_to_its_average_under_the_masks(league_batch):
    """Hand-computed: softmax of both networks' masked logits, sum p log(p / q) per row, the mean
    over the valid rows, times ``magnet_coeff`` added to the loss."""
    batch, spaces = league_batch
    cfg = small()
    learner = make_learner(cfg, spaces)
    module, loss_fn = learner.learner.module, learner.learner.loss_fn
    tensors = batch.to_torch()
    tensors[Col.VALID] = tensors[Col.VALID].clone()
    tensors[Col.VALID][3::7] = False  # rows the means skip (as padding after a reset would be)
    loss_at_policy, stats = loss_fn(module, tensors)
    assert float(stats["magnet_kl"]) == pytest.approx(0.0, abs=1e-7)  # the magnet starts at the policy
    perturb(learner.average.net, 0.3, seed=1)
    learner.average._version += 1  # as a refresh does
    loss, stats = loss_fn(module, tensors)
    with torch.no_grad():
        mask = tensors[Col.ACTION_MASK]
        logp = torch.log_softmax(masked_logits(module(tensors[Col.OBS])[0], mask), -1)
        logq = torch.log_softmax(masked_logits(learner.average.net(tensors[Col.OBS])[0], mask), -1)
        per_row = (logp.exp() * (logp - logq)).sum(-1)
        valid = tensors[Col.VALID].bool()
        expected = float(per_row[valid].mean())
    assert expected > 1e-3
    assert float(stats["magnet_kl"]) == pytest.approx(expected, rel=1e-4)
    # the rest of the loss does not see the magnet: the difference is the term alone
    assert float((loss - loss_at_policy).detach()) == pytest.approx(cfg.magnet_coeff * expected, rel=1e-3)
    assert time_major(per_row, cfg.rollout_fragment_length).shape[0] == cfg.rollout_fragment_length


def test_the_average_moves_tau_of_the_way_after_each_update_and_syncs_with_the_weights(league_batch):
    batch, spaces = league_batch
    cfg = small(num_sgd_iter=1, train_batch_size=len(batch))
    replay = BatchReplay(capacity=4)
    learner = make_learner(cfg, spaces, replay)
    average, module = learner.average, learner.learner.module
    perturb(average.net, 0.5, seed=2)
    before = [p.detach().clone() for p in average.net.parameters()]
    replay.add_batch("main", batch)
    out = learner.learn()
    assert out is not None and learner.learner.num_updates == 1
    for m, b, p in zip(average.net.parameters(), before, module.parameters()):
        torch.testing.assert_close(m, 0.75 * b + 0.25 * p.detach(), rtol=0, atol=1e-6)
    # the policy's weights replaced from outside (a league copy): the magnet starts again at them
    weights = {k: v + 0.1 for k, v in learner.get_weights().items()}
    learner.set_weights(weights)
    for (name, _), m in zip(module.named_parameters(), average.net.parameters()):
        np.testing.assert_allclose(m.detach().numpy(), weights[name], atol=1e-6)


def test_the_average_is_saved_and_restored_with_the_policy(league_batch):
    _, spaces = league_batch
    cfg = small()
    learner = make_learner(cfg, spaces)
    perturb(learner.average.net, 0.4, seed=3)
    state = learner.get_state()
    other = make_learner(cfg, spaces)
    other.set_state(state)
    for a, b in zip(learner.average.net.parameters(), other.average.net.parameters()):
        torch.testing.assert_close(a, b)
    # a state saved without an average (the key was off): the average starts at the restored policy
    del state["average"]
    third = make_learner(cfg, spaces)
    third.set_state(state)
    for a, b in zip(third.average.net.parameters(), third.learner.module.parameters()):
        torch.testing.assert_close(a, b)


def kuhn_league(**kw) -> AlphaStarConfig:
    """A small Kuhn-poker league (main and a random player), evaluated every iteration."""
    base = dict(
        env="openspiel:kuhn_poker",
        seed=0,
        lr=0.01,
        rollout_fragment_length=4,
        train_batch_size=64,
        max_num_policies_to_train=1,
        min_time_s_per_iteration=0.0,
        league={"type": "alpha_star", "num_main_exploiters": 0, "num_league_exploiters": 0, "num_random_policies": 1},
        model={"hiddens": [16]},
        resources={"num_envs_per_worker": 8},
        evaluation={"evaluation_interval": 1, "evaluation_num_episodes": 4},
    )
    return AlphaStarConfig(**{**base, **kw})


def test_the_loaded_main_average_is_the_one_whose_exploitability_is_reported(tmp_path):
    """A Kuhn-poker league with ``average_tau``: its evaluation reports main's average's
    exploitability, the summary names it, and ``load_policy(policy="main@average")`` plays a policy
    exactly that exploitable (and not main's own: the average lags the policy)."""
    import pyspiel

    import shoal
    from shoal.league.exploitability import exploitability, tabular_policy

    cfg = kuhn_league(average_tau=0.05, magnet_coeff=0.2)
    with cfg.build() as algo:
        results = [algo.train() for _ in range(3)]
        path = algo.save(tmp_path / "ckpt")
        reported = results[-1]["evaluation/main_average_exploitability"]
        main = results[-1]["evaluation/exploitability"]
        assert "main's average (main@average, of its parameters)" in " ".join(algo.summary_lines(results))
        with pytest.raises(ConfigError, match="'random_0' is not learning"):
            algo.exploitability("random_0@average")
    assert results[-1]["learner/main/magnet_kl"] > 0  # the pull was on
    assert abs(reported - main) > 1e-6
    game = pyspiel.load_game("kuhn_poker")
    loaded = shoal.load_policy(path, policy="main@average")
    assert loaded.policy_id == "main@average"
    table = tabular_policy(game, loaded.action_probabilities)
    assert exploitability(game, table) == pytest.approx(reported, abs=1e-6)
    with pytest.raises(ConfigError, match="no average of 'random_0': only a player learning.*main@average"):
        shoal.load_policy(path, policy="random_0@average")


def test_asking_for_an_average_the_league_does_not_keep_names_the_key():
    cfg = AlphaStarConfig(
        env="openspiel:kuhn_poker",
        seed=0,
        rollout_fragment_length=4,
        train_batch_size=64,
        max_num_policies_to_train=1,
        min_time_s_per_iteration=0.0,
        league="no_league",
        average_tau=None,
        model={"hiddens": [8]},
        resources={"num_envs_per_worker": 4},
    )
    with cfg.build() as algo:
        with pytest.raises(ConfigError, match="keeps none .average_policy is None.: set average_policy"):
            algo.exploitability("main@average")
