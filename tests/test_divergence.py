"""Learner divergence: NaN/inf updates are skipped and counted, a run of them stops the run with a
DivergenceError (exit 2 from the CLI), and no checkpoint ever holds non-finite weights."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from helpers import invoke

from shoal import PPOConfig
from shoal import checkpoint as ckpt
from shoal.errors import ConfigError, DivergenceError
from shoal.learn import Learner
from shoal.learn.threads import BackgroundThread

SMALL = dict(
    env="CartPole-v1",
    train_batch_size=128,
    minibatch_size=64,
    num_sgd_iter=1,
    seed=0,
    resources={"num_envs_per_worker": 2},
)


def _learner(poison: list[bool], **kw) -> Learner:
    """y = w x with w = 1: loss (w x - 2x)^2 on x = 1, gradient 2 (w - 2) = -2; ``poison`` makes the loss NaN."""
    module = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        module.weight.fill_(1.0)

    def loss_fn(m, batch, learner):
        loss = ((m(batch["x"]) - 2 * batch["x"]) ** 2).mean()
        if poison.pop(0):
            loss = loss * float("nan")
        return loss, {"mse": loss.detach()}

    learner = Learner(module, loss_fn, lr=0.1, **kw)
    learner.optimizer = torch.optim.SGD(module.parameters(), lr=0.1)  # plain SGD: hand-computed steps
    return learner


def _step(learner: Learner) -> float:
    learner.update_minibatch({"x": torch.ones(1, 1)})
    return float(learner.module.weight.detach())


def test_nonfinite_update_is_skipped_and_counted():
    learner = _learner([False, True, True, False], grad_clip=None, max_nonfinite_updates=3)
    assert _step(learner) == pytest.approx(1.2)  # 1 - 0.1 * (-2)
    assert _step(learner) == pytest.approx(1.2)  # NaN loss: skipped, weights untouched
    assert _step(learner) == pytest.approx(1.2)
    assert learner.num_nonfinite_skipped == 2 and learner.num_updates == 1
    assert _step(learner) == pytest.approx(1.36)  # 1.2 - 0.1 * 2 * (1.2 - 2); the run of NaN ends
    assert learner._nonfinite_in_a_row == 0 and learner.num_updates == 2
    assert learner.get_state()["num_nonfinite_skipped"] == 2


def test_a_run_of_nonfinite_updates_raises_naming_the_loss_term():
    learner = _learner([True, True, True], grad_clip=0.5, max_nonfinite_updates=3)
    _step(learner)
    _step(learner)
    with pytest.raises(DivergenceError) as info:
        _step(learner)
    msg = str(info.value)
    assert "3 learner updates in a row" in msg and "mse=nan" in msg and "lr 0.1" in msg
    assert "max_nonfinite_updates=3" in msg
    assert float(learner.module.weight.detach()) == 1.0


def test_nonfinite_weights_raise_at_once():
    learner = _learner([False], grad_clip=None)
    with torch.no_grad():
        learner.module.weight.fill_(float("inf"))
    with pytest.raises(DivergenceError, match="weights hold NaN or inf"):
        _step(learner)


def test_learner_update_reports_the_skip_in_a_ppo_result():
    with PPOConfig(**SMALL).build() as algo:
        loss_fn, calls = algo.learner.loss_fn, [0]

        def nan_twice(module, batch, learner):
            loss, stats = loss_fn(module, batch, learner)
            calls[0] += 1
            return (loss * float("nan"), stats) if calls[0] <= 2 else (loss, stats)

        algo.learner.loss_fn = nan_twice
        result = algo.train()
        assert result["num_nonfinite_updates_skipped"] == 2
        assert all(np.isfinite(w).all() for w in algo.get_weights().values())


def test_thread_divergence_reaches_the_driver_as_itself():
    class Diverging(BackgroundThread):
        def step(self):
            raise DivergenceError("3 learner updates in a row had a non-finite loss")

    t = Diverging()
    t.start()
    t.join(5)
    with pytest.raises(DivergenceError, match="non-finite loss"):
        t.check()


def test_checkpoint_refuses_nonfinite_weights(tmp_path):
    state = {
        "learner": {"module": {"w": torch.tensor([1.0, float("nan")])}},
        "replay": {"obs": torch.tensor([math.inf])},
    }
    assert ckpt.nonfinite_tensor(state) == "learner.module.w"
    with pytest.raises(DivergenceError, match="learner.module.w"):
        ckpt.save_checkpoint(tmp_path / "c", state, {"algo": "ppo"})
    assert not (tmp_path / "c").exists()
    state["learner"]["module"]["w"] = torch.ones(2)
    ckpt.save_checkpoint(tmp_path / "c", state, {"algo": "ppo"})  # inf in replay data is not a weight


def test_infinite_lr_is_a_config_error():
    with pytest.raises(ConfigError, match="lr"):
        PPOConfig(env="CartPole-v1", lr=math.inf)
    with pytest.raises(ConfigError, match="finite"):
        PPOConfig(env="CartPole-v1", lr_schedule=[[0, 1e-3], [100, math.inf]])


def test_cli_lr_inf_exits_2(tmp_path):
    r = invoke("train", "ppo", "--env", "CartPole-v1", "--set", "lr=inf", "--stop-iters", 2, "-q", "--out", tmp_path)
    assert r.exit_code == 2 and "lr" in r.output and "finite" in r.output and "Traceback" not in r.output


def test_cli_divergence_mid_run_exits_2_and_keeps_finite_checkpoints(tmp_path):
    # lr jumps to 1e30 after 300 env steps: iterations 1 and 2 (128 steps each) learn, iteration 3 diverges
    schedule = "lr_schedule=[[0, 0.001], [300, 0.001], [301, 1.0e+30]]"
    r = invoke(
        "train",
        "ppo",
        "--env",
        "CartPole-v1",
        "--set",
        "train_batch_size=128",
        "--set",
        "minibatch_size=64",
        "--set",
        "num_sgd_iter=2",
        "--set",
        schedule,
        "--set",
        "max_nonfinite_updates=3",
        "--seed",
        0,
        "--envs-per-worker",
        2,
        "--stop-iters",
        6,
        "--checkpoint-every",
        1,
        "-q",
        "--out",
        tmp_path,
    )
    out = " ".join(r.output.split())
    assert r.exit_code == 2, r.output
    assert "Training diverged in iteration 3" in out and "lr 1e+30" in out and "Traceback" not in out
    run = next(tmp_path.iterdir())
    assert [p.name for p in ckpt.list_checkpoints(run / "checkpoints")] == ["checkpoint_000001", "checkpoint_000002"]
    assert "newest checkpoint (finite weights) is" in out and "checkpoint_000002" in out
    for p in [*ckpt.list_checkpoints(run / "checkpoints"), run / "checkpoints" / "best"]:
        state, _ = ckpt.load_checkpoint(p)
        assert ckpt.nonfinite_tensor(state) is None
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [1, 2]


def test_dqn_skipped_updates_leave_the_priorities_alone():
    """A skipped update's TD errors are NaN: they must not reach the prioritized replay (it refuses NaN)."""
    from shoal import DQNConfig

    cfg = DQNConfig(
        env="CartPole-v1",
        seed=0,
        lr=1e30,
        learning_starts=64,
        train_batch_size=32,
        max_nonfinite_updates=3,
        resources={"num_envs_per_worker": 2},
    )
    with cfg.build() as algo:
        with pytest.raises(DivergenceError, match="3 learner updates in a row"):
            for _ in range(50):
                algo.train()
        assert np.isfinite(algo.replay.stats().get("max_priority", 1.0))


def test_impala_learner_thread_divergence_stops_the_run_as_itself():
    from shoal import IMPALAConfig

    cfg = IMPALAConfig(
        env="CartPole-v1",
        seed=0,
        lr=1e30,
        max_nonfinite_updates=3,
        rollout_fragment_length=16,
        train_batch_size=64,
        resources={"num_envs_per_worker": 4},
    )
    with cfg.build() as algo:
        with pytest.raises(DivergenceError, match=r"Training diverged in iteration \d+: .*3 learner updates in a row"):
            for _ in range(30):
                algo.train()


def test_league_policy_learner_counts_and_stops_on_divergence():
    from shoal.algorithms.alpha_star import AlphaStarConfig

    cfg = AlphaStarConfig(
        env="pettingzoo.classic:tictactoe_v3",
        seed=0,
        rollout_fragment_length=8,
        train_batch_size=64,
        min_time_s_per_iteration=0.0,
        league="no_league",
        max_num_policies_to_train=1,
        model={"hiddens": [16]},
        lr=1e30,
        max_nonfinite_updates=6,
        num_sgd_iter=1,
        resources={"num_envs_per_worker": 4},
    )
    counts = []
    with cfg.build() as algo:
        with pytest.raises(DivergenceError, match="6 learner updates in a row"):
            for _ in range(30):
                counts.append(algo.train()["num_nonfinite_updates_skipped"])
    assert counts == sorted(counts) and 0 < counts[-1] < 6  # counted while the run went on
