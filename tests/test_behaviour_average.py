"""A league policy's behaviour average (``average_policy: behaviour``): a copy of the policy's
network trained by supervision on the policy's own actions over a sliding window of its play.
The window keeps the newest valid rows; the supervised loss is the actions' negative
log-likelihood under the masks they were played with; trained, the copy plays the window's
action frequencies; the league reports and loads it as ``main@average``."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from test_policy_average import kuhn_league, make_learner, perturb, small, ttt_batch

from shoal.algorithms.alpha_star import AlphaStar, AlphaStarConfig
from shoal.batch import Batch, Col
from shoal.config.sections import ModelConfig
from shoal.errors import ConfigError
from shoal.learn.behaviour_average import BehaviourAverage
from shoal.learn.learner_params import BehaviourAverageParams, LearnerParams
from shoal.models import build_actor_critic
from shoal.models.distributions import masked_logits

torch.set_num_threads(1)
OBS = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
ACTIONS = gym.spaces.Discrete(3)
KUHN = "openspiel:kuhn_poker"


def module(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_actor_critic(OBS, ACTIONS, ModelConfig(hiddens=[16]))


def rows(actions, *, obs=None, valid=None, mask=None) -> Batch:
    n = len(actions)
    cols = {
        Col.OBS: np.zeros((n, 2), np.float32) if obs is None else np.asarray(obs, np.float32),
        Col.ACTIONS: np.asarray(actions, np.int64),
        Col.ACTION_MASK: np.ones((n, 3), bool) if mask is None else np.asarray(mask, bool),
    }
    if valid is not None:
        cols[Col.VALID] = np.asarray(valid, bool)
    return Batch(cols)


def held(avg: BehaviourAverage, col: str) -> np.ndarray:
    """The window's rows of ``col`` in slot order."""
    return np.asarray(avg.window_rows.get_state()["columns"][col])


def test_the_window_keeps_the_newest_valid_rows():
    avg = BehaviourAverage(module(), window=4, sgd_steps=1, batch_size=2, lr=1e-3, seed=0)
    obs = np.arange(10, dtype=np.float32).reshape(5, 2)  # first column 0, 2, 4, 6, 8
    assert avg.add(rows([0, 1, 2, 0, 1], obs=obs, valid=[1, 1, 0, 1, 1])) == 4  # the reset row is not play
    assert avg.size == 4
    assert avg.add(rows([2, 2], obs=obs[:2] + 100)) == 2  # slots 0 and 1 overwritten, oldest first
    assert avg.size == 4 and avg.rows_seen == 6
    np.testing.assert_array_equal(held(avg, Col.OBS)[:, 0], [100, 102, 6, 8])
    np.testing.assert_array_equal(held(avg, Col.ACTIONS), [2, 2, 0, 1])
    assert avg.add(rows([1] * 6, obs=np.arange(12).reshape(6, 2))) == 4  # more than a window: its newest four
    np.testing.assert_array_equal(held(avg, Col.OBS)[:, 0], [8, 10, 4, 6])  # slots 2, 3, 0, 1 in order of play
    assert avg.add(rows([0], valid=[0])) == 0 and avg.rows_seen == 10


def test_the_loss_is_the_actions_negative_log_likelihood_under_their_masks():
    """One row in the window, so every draw is it: the step's loss is -log softmax of the masked
    logits at the action, computed here from the network before the step."""
    net = module()
    avg = BehaviourAverage(net, window=8, sgd_steps=1, batch_size=5, lr=1e-3, seed=0)
    obs, mask = np.array([[0.3, -0.7]], np.float32), np.array([[True, False, True]])
    avg.add(rows([2], obs=obs, mask=mask))
    with torch.no_grad():
        logits = avg.net(torch.from_numpy(obs))[0][0].numpy().astype(np.float64)
    legal = logits[[0, 2]]
    expected = -(legal[1] - np.log(np.exp(legal).sum()))
    assert avg.train() == pytest.approx(expected, rel=1e-5)
    # the copy learns; the policy's own network is untouched
    for a, b in zip(net.parameters(), module().parameters()):
        torch.testing.assert_close(a, b)


def test_trained_it_plays_the_windows_action_frequencies_and_forgets_older_play():
    avg = BehaviourAverage(module(), window=400, sgd_steps=1, batch_size=256, lr=3e-3, seed=0)
    mask = np.tile([True, True, False], (100, 1))
    for a in (0, 0, 0, 1):  # 300 rows of action 0, then 100 of action 1 (action 2 illegal)
        avg.add(rows([a] * 100, mask=mask))
    for _ in range(600):
        avg.train()

    def probs():
        with torch.no_grad():
            logits = avg.net(torch.zeros(1, 2))[0]
        return torch.softmax(logits[:, :2], -1)[0].numpy()

    np.testing.assert_allclose(probs(), [0.75, 0.25], atol=0.03)
    for _ in range(2):  # 200 more rows of action 1 replace the 200 oldest: the window holds 100 zeros, 300 ones
        avg.add(rows([1] * 100, mask=mask))
    for _ in range(600):
        avg.train()
    np.testing.assert_allclose(probs(), [0.25, 0.75], atol=0.03)


def test_its_state_keeps_the_network_and_optimizer_not_the_window():
    avg = BehaviourAverage(module(), window=16, sgd_steps=3, batch_size=8, lr=1e-2, seed=0)
    avg.add(rows([0, 1, 2, 1]))
    avg.train()
    other = BehaviourAverage(module(seed=1), window=16, sgd_steps=3, batch_size=8, lr=1e-2, seed=0)
    other.set_state(avg.get_state())
    for a, b in zip(avg.net.parameters(), other.net.parameters()):
        torch.testing.assert_close(a, b)
    assert other.size == 0 and other.train() is None  # the window refills from new play
    assert other.optimizer.state_dict()["state"].keys() == avg.optimizer.state_dict()["state"].keys()


def test_the_keys_reach_the_learner_record_and_are_checked():
    cfg = AlphaStarConfig(env=KUHN, seed=3, average_policy="behaviour", average_window=1000, average_lr=0.01)
    params = LearnerParams.from_config(cfg)
    assert params.average_tau is None
    assert params.behaviour_average == BehaviourAverageParams(1000, 2, 512, 0.01, 3)
    assert LearnerParams.from_config(AlphaStarConfig(env=KUHN)).behaviour_average is None  # parameters by default
    assert LearnerParams.from_config(AlphaStarConfig(env=KUHN, average_policy=None)).average_tau is None
    with pytest.raises(
        ConfigError, match="average_tau .0.01. sets the parameters average, and average_policy is behaviour"
    ):
        AlphaStarConfig(env=KUHN, average_policy="behaviour", average_tau=0.01)
    with pytest.raises(
        ConfigError, match="average_window .10. sets the behaviour average, and average_policy is parameters"
    ):
        AlphaStarConfig(env=KUHN, average_window=10)
    assert LearnerParams.from_config(  # the magnet pulls towards whichever average is kept
        AlphaStarConfig(env=KUHN, average_policy="behaviour", magnet_coeff=0.1)
    ).magnet_coeff == pytest.approx(0.1)
    with pytest.raises(ConfigError, match="magnet_coeff .0.1. pulls .* average_policy is None"):
        AlphaStarConfig(env=KUHN, average_policy=None, magnet_coeff=0.1)
    with pytest.raises(ConfigError, match="model.use_lstm is true: use average_policy: parameters"):
        AlphaStarConfig(env=KUHN, average_policy="behaviour", model={"use_lstm": True})
    with pytest.raises(ConfigError, match="average_policy"):
        AlphaStarConfig(env=KUHN, average_policy="nfsp")
    # a full dump of a config carries every default: it reloads
    cfg.copy_with(lr=0.01)


def test_a_recurrent_network_is_refused():
    net = build_actor_critic(OBS, ACTIONS, ModelConfig(hiddens=[8], use_lstm=True))
    with pytest.raises(ConfigError, match="recurrent: use average_policy: parameters"):
        BehaviourAverage(net, window=4, sgd_steps=1, batch_size=2, lr=1e-3)


def test_the_loaded_main_average_is_the_behaviour_average_whose_exploitability_is_reported(tmp_path):
    """A Kuhn-poker league keeping behaviour averages: main's learner trains one after each
    update (``learner/main/average_nll``), the evaluation reports its exploitability, the
    summary names it, a checkpoint holds it, and ``load_policy(policy="main@average")`` plays a
    policy exactly that exploitable; a restored run continues from the saved network."""
    import pyspiel

    import shoal
    from shoal.league.exploitability import exploitability, tabular_policy

    cfg = kuhn_league(average_policy="behaviour", average_window=2000, average_batch_size=64)
    with cfg.build() as algo:
        results = [algo.train() for _ in range(3)]
        path = algo.save(tmp_path / "ckpt")
        reported = results[-1]["evaluation/main_average_exploitability"]
        main = results[-1]["evaluation/exploitability"]
        saved = algo.average_weights("main")
        assert "main's average (main@average, of its behaviour)" in " ".join(algo.summary_lines(results))
    assert results[-1]["learner/main/average_nll"] > 0
    assert abs(reported - main) > 1e-6  # the copy is not the policy
    game = pyspiel.load_game("kuhn_poker")
    loaded = shoal.load_policy(path, policy="main@average")
    table = tabular_policy(game, loaded.action_probabilities)
    assert exploitability(game, table) == pytest.approx(reported, abs=1e-6)
    with AlphaStar.from_checkpoint(path) as restored:
        for k, v in restored.average_weights("main").items():
            np.testing.assert_array_equal(v, saved[k])


def test_main_vs_average_prob_splits_mains_self_play_with_its_average():
    """The alpha_star builder gives ``main_vs_average_prob`` of main's self-play share to
    ``main@average``; with a frozen player, the rest of main's games still go to it by PFSP."""
    from shoal.league import make_league_builder

    spec = {"type": "alpha_star", "num_main_exploiters": 0, "num_league_exploiters": 0, "num_random_policies": 1}
    b = make_league_builder({**spec, "main_self_play_prob": 0.6, "main_vs_average_prob": 0.25})
    pairs = {(home, away): p for _, home, away, p in b.matchmaking().pairs()}
    assert pairs == pytest.approx({("main", "main"): 0.45, ("main", "main@average"): 0.15, ("main", "random_0"): 0.4})
    b = make_league_builder({**spec, "main_self_play_prob": 1.0, "main_vs_average_prob": 1.0})
    assert {(h, a) for _, h, a, _ in b.matchmaking().pairs()} == {("main", "main@average")}  # no zero pair
    with pytest.raises(ConfigError, match="main_vs_average_prob .0.5. plays main against its average, and "):
        kuhn_league(average_policy=None, league={**spec, "main_vs_average_prob": 0.5})


def test_main_plays_its_average_whose_weights_follow_its_learner(tmp_path):
    """With ``main_vs_average_prob: 1``, a Kuhn league's main plays only ``main@average`` (a player
    of the rollout actors, not of the league: those games count in no win rate, no PFSP, no
    mixture); after each iteration that player's weights are the learner's behaviour average, and
    it stays a frozen player through a checkpoint restore."""
    spec = {"type": "alpha_star", "num_main_exploiters": 0, "num_league_exploiters": 0, "num_random_policies": 1}
    league = {**spec, "main_self_play_prob": 1.0, "main_vs_average_prob": 1.0}
    cfg = kuhn_league(average_policy="behaviour", average_window=2000, average_batch_size=64, league=league)
    with cfg.build() as algo:
        results = [algo.train() for _ in range(3)]
        assert "main@average" in algo.policies.frozen and "main@average" not in algo.league.players
        for k, v in algo.average_weights("main").items():
            np.testing.assert_array_equal(algo.policies.weights("main@average")[k], v)
        assert not any(
            np.array_equal(v, algo.policies.weights("main")[k]) for k, v in algo.average_weights("main").items()
        )
        assert results[-1]["league/dropped_results"] > 0  # its games: in no one's win rate
        assert results[-1]["learner/main/average_nll"] > 0
        assert algo.league.frozen_policies() == ["random_0"]
        assert results[-1]["num_policies"] == 2  # the league's players: main and random_0
        path = algo.save(tmp_path / "ckpt")
    with AlphaStar.from_checkpoint(path) as restored:
        assert "main@average" in restored.policies.frozen
        restored.train()


def test_a_window_that_does_not_fit_in_memory_is_a_clear_error(monkeypatch):
    """A full window is sized at the first add: 1,000 rows of 2 float32 observations, an int64
    action and 3 mask bytes are 19 kB; with 10 kB available the error names average_window and
    the remedy, and nothing is kept; with 20 kB the rows go in."""
    from shoal import process

    monkeypatch.setattr(process, "available_memory_bytes", lambda: 10_000)
    avg = BehaviourAverage(module(), window=1000, sgd_steps=1, batch_size=2, lr=1e-3, seed=0)
    with pytest.raises(ConfigError, match=r"average_window \(1,000 rows\) is too large .* 19 bytes each"):
        avg.add(rows([0, 1], obs=np.zeros((2, 2), np.float32)))
    assert avg.size == 0
    monkeypatch.setattr(process, "available_memory_bytes", lambda: 20_000)
    assert avg.add(rows([0, 1], obs=np.zeros((2, 2), np.float32))) == 2


def test_the_magnet_pulls_towards_the_behaviour_average_and_follows_its_training():
    """``magnet_coeff`` with ``average_policy: behaviour``: the loss's term is KL(pi || the behaviour
    network) under the masks, hand-computed; it starts at 0 (the copy is the policy) and reads the
    network's weights as its supervised steps change them."""
    batch, spaces = ttt_batch()
    cfg = small(average_policy="behaviour", average_tau=0.002, average_window=256, magnet_coeff=0.5)
    learner = make_learner(cfg, spaces)
    assert learner.average is None and learner.behaviour is not None
    assert learner.learner.loss_fn.magnet is learner.behaviour
    module, loss_fn = learner.learner.module, learner.learner.loss_fn
    tensors = batch.to_torch()
    loss_at_policy, stats = loss_fn(module, tensors)
    assert float(stats["magnet_kl"]) == pytest.approx(0.0, abs=1e-7)

    def expected_kl() -> float:
        with torch.no_grad():
            mask = tensors[Col.ACTION_MASK]
            logp = torch.log_softmax(masked_logits(module(tensors[Col.OBS])[0], mask), -1)
            logq = torch.log_softmax(masked_logits(learner.behaviour.net(tensors[Col.OBS])[0], mask), -1)
            per_row = (logp.exp() * (logp - logq)).sum(-1)
            return float(per_row[tensors[Col.VALID].bool()].mean())

    perturb(learner.behaviour.net, 0.3, seed=1)
    loss, stats = loss_fn(module, tensors)
    first = expected_kl()
    assert first > 1e-3
    assert float(stats["magnet_kl"]) == pytest.approx(first, rel=1e-4)
    assert float((loss - loss_at_policy).detach()) == pytest.approx(cfg.magnet_coeff * first, rel=1e-3)
    learner.behaviour.add(batch)  # supervised steps move the network: the term reads the new weights
    learner.behaviour.train()
    _, stats = loss_fn(module, tensors)
    assert expected_kl() != pytest.approx(first, rel=1e-3)
    assert float(stats["magnet_kl"]) == pytest.approx(expected_kl(), rel=1e-4)


def test_a_replica_reads_a_copy_of_the_behaviour_network_refreshed_after_training():
    """A multi-device learner's replica (here a second module on the CPU standing in for another
    device) gets its own copy of the magnet, reloaded once the network has trained since."""
    policy, replica = module(0), module(1)
    avg = BehaviourAverage(policy, window=8, sgd_steps=1, batch_size=4, lr=0.1, seed=0)
    assert avg.for_module(policy) is avg.net
    copy_ = avg.for_module(replica)
    assert copy_ is not avg.net and avg.for_module(replica) is copy_  # kept while nothing changed
    obs = torch.zeros(1, 2)
    torch.testing.assert_close(copy_(obs)[0], avg.net(obs)[0])
    avg.add(rows([2, 2, 2, 2]))
    avg.train()
    assert not torch.allclose(copy_(obs)[0], avg.net(obs)[0])  # stale until asked for again
    assert avg.for_module(replica) is copy_
    torch.testing.assert_close(copy_(obs)[0], avg.net(obs)[0])
