"""Learner.beside: a loss term whose forward and backward run on the learner's side thread
(``actor_loss_thread`` of SAC and Ape-X TD3) gives the same update as the summed loss."""

from __future__ import annotations

import threading

import gymnasium as gym
import numpy as np
import pytest
import torch

from shoal.algorithms.apex_td3 import ApeXTD3Config, TD3PolicyLearner
from shoal.algorithms.sac import SACConfig, SACPolicyLearner
from shoal.batch import Col
from shoal.learn import Learner


class TwoParams(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(2.0))
        self.b = torch.nn.Parameter(torch.tensor(-1.0))


def two_term_loss(threads: list[str]):
    """(a - 3)^2 on the calling thread and 4 b^2 beside it: gradients -2 and -8 at a=2, b=-1."""

    def loss(module, batch, learner):
        def term():
            threads.append(threading.current_thread().name)
            value = 4.0 * module.b**2
            return value, {"b_term": value.detach()}

        main = (module.a - 3.0) ** 2
        if not learner.beside(term):
            value, stats = term()
            return main + value, {"a_term": main.detach(), **stats}
        return main, {"a_term": main.detach()}

    return loss


@pytest.mark.parametrize("side", [False, True])
def test_a_term_beside_gives_the_summed_losss_gradients_and_stats(side):
    threads: list[str] = []
    m = TwoParams()
    learner = Learner(m, two_term_loss(threads), lr=0.1, side_thread=side)
    stats = learner.compute_gradients({})
    assert m.a.grad.item() == pytest.approx(-2.0) and m.b.grad.item() == pytest.approx(-8.0)
    assert stats["a_term"].item() == pytest.approx(1.0) and stats["b_term"].item() == pytest.approx(4.0)
    assert learner.last_stats["loss"].item() == pytest.approx(5.0)  # both terms, wherever one ran
    assert threads[0].startswith("shoal-learner-side") == side
    learner.apply_gradients()
    assert learner.num_updates == 1


def test_a_failing_term_beside_raises_in_the_update_and_the_next_update_runs():
    m = TwoParams()
    fail = [True]

    def loss(module, batch, learner):
        def term():
            if fail[0]:
                raise ValueError("term broke")
            return module.b**2, {}

        learner.beside(term)
        return module.a**2, {}

    learner = Learner(m, loss, lr=0.1, side_thread=True)
    with pytest.raises(ValueError, match="term broke"):
        learner.compute_gradients({})
    fail[0] = False
    learner.compute_gradients({})
    assert m.a.grad.item() == pytest.approx(4.0) and m.b.grad.item() == pytest.approx(-2.0)


def replay_batches(n: int, rows: int = 64) -> list[dict]:
    rng = np.random.default_rng(0)
    return [
        {
            Col.OBS: torch.from_numpy(rng.standard_normal((rows, 3), dtype=np.float32)),
            Col.ACTIONS: torch.from_numpy(rng.uniform(-1, 1, (rows, 1)).astype(np.float32)),
            Col.NEXT_OBS: torch.from_numpy(rng.standard_normal((rows, 3), dtype=np.float32)),
            Col.REWARDS: torch.from_numpy(rng.standard_normal(rows).astype(np.float32)),
            Col.DISCOUNTS: torch.full((rows,), 0.99),
            Col.TERMINATEDS: torch.from_numpy(rng.random(rows) < 0.1),
        }
        for _ in range(n)
    ]


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_actor_loss_thread_trains_exactly_as_one_thread(algo):
    """Five updates (three of them, the last too, TD3's delayed actor updates) from the same seed: the same weights
    and targets to the last bit, the same reported losses."""
    env = gym.make("Pendulum-v1")
    runs = []
    for side in (False, True):
        kw = {"env": "Pendulum-v1", "model": {"hiddens": [32, 16]}, "actor_loss_thread": side, "seed": 0}
        if algo == "sac":
            pl = SACPolicyLearner(SACConfig(**kw), env.observation_space, env.action_space, seed=0)
        else:
            pl = TD3PolicyLearner(ApeXTD3Config(**kw), env.observation_space, env.action_space, seed=0)
        torch.manual_seed(5)
        losses = [pl.learner.update_minibatch(b) and float(pl.learner.last_stats["loss"]) for b in replay_batches(5)]
        state = {k: v.clone() for k, v in pl.learner.module.state_dict().items()}
        runs.append((losses, state, set(pl.learner.last_stats)))
    (losses0, state0, keys0), (losses1, state1, keys1) = runs
    assert losses0 == pytest.approx(losses1, rel=1e-6)
    assert state0.keys() == state1.keys()
    for k in state0:
        assert torch.equal(state0[k], state1[k]), k
    assert keys0 == keys1 and "actor_loss" in keys1


def test_a_multi_device_tower_adds_its_terms_itself():
    """A tower's update never waits on the master's side thread, so the tower takes no term beside."""
    from shoal.learn.multi_device import _TowerView

    threads: list[str] = []
    master = Learner(TwoParams(), two_term_loss(threads), lr=0.1, side_thread=True)
    tower = TwoParams()
    view = _TowerView(master, tower, torch.device("cpu"))
    loss, stats = two_term_loss(threads)(tower, {}, view)
    loss.backward()
    assert tower.a.grad.item() == pytest.approx(-2.0) and tower.b.grad.item() == pytest.approx(-8.0)
    assert "b_term" in stats and threads == [threading.current_thread().name]
    assert view.lr == 0.1  # the rest still reads the master's
