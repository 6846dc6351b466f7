"""entropy_coeff_schedule: the entropy bonus's weight moves piecewise-linearly with sampled env steps."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml

from shoal.algorithms.appo import APPOConfig
from shoal.algorithms.ppo import PPOConfig
from shoal.errors import ConfigError
from shoal.learn.learner import Learner

SCHEDULE = [[0, 0.1], [1000, 0.02], [3000, 0.0]]


def expected(steps: float) -> float:
    """SCHEDULE by hand: 0.1 -> 0.02 over the first 1000 steps, -> 0 over the next 2000, then flat."""
    if steps <= 1000:
        return 0.1 - 0.08 * steps / 1000
    if steps <= 3000:
        return 0.02 - 0.02 * (steps - 1000) / 2000
    return 0.0


@dataclasses.dataclass
class ToyLoss:
    entropy_coeff: float
    calls: int = 0

    def __call__(self, module, batch, learner=None):
        return module(batch["x"]).pow(2).mean() * (1 + self.entropy_coeff), {}


def test_the_learner_replaces_the_scheduled_loss_field_as_env_steps_move():
    learner = Learner(
        torch.nn.Linear(2, 1), ToyLoss(entropy_coeff=0.5), lr=1e-3, loss_schedules={"entropy_coeff": SCHEDULE}
    )
    assert learner.loss_fn.entropy_coeff == pytest.approx(0.1)  # the schedule at 0, not the loss's own 0.5
    for steps, want in [(250, 0.08), (1000, 0.02), (2000, 0.01), (3000, 0.0), (10**6, 0.0)]:
        learner.set_env_steps(steps)
        assert learner.loss_fn.entropy_coeff == pytest.approx(want) == pytest.approx(expected(steps))
        assert learner.schedule_stats() == {"entropy_coeff": pytest.approx(want)}
    assert Learner(torch.nn.Linear(2, 1), ToyLoss(0.5), lr=1e-3).schedule_stats() == {}


@pytest.mark.parametrize(
    "bad, message",
    [
        ([[0]], "entropy_coeff_schedule[0] is [0]; each point is [env_steps, entropy_coeff]"),
        ([], "entropy_coeff_schedule needs at least one"),
        ([[10, 0.1], [0, 0.0]], "increasing env_steps"),
        ([[0, -0.1]], "entropy_coeff_schedule values must be finite numbers >= 0"),
    ],
)
def test_a_bad_schedule_is_refused_naming_the_key(bad, message):
    with pytest.raises(ConfigError) as ei:
        PPOConfig(env="CartPole-v1", entropy_coeff_schedule=bad)
    assert message in str(ei.value)


def test_the_schedule_round_trips_through_the_run_config():
    cfg = APPOConfig(env="CartPole-v1", entropy_coeff_schedule=SCHEDULE)
    data = yaml.safe_load(cfg.to_yaml())
    assert data["entropy_coeff_schedule"] == SCHEDULE
    data.pop("algo", None)
    assert APPOConfig(**data).entropy_coeff_schedule == [tuple(p) for p in SCHEDULE]


def test_ppo_learns_with_the_scheduled_weight_and_reports_it():
    cfg = PPOConfig(
        env="CartPole-v1",
        seed=0,
        train_batch_size=400,
        minibatch_size=100,
        num_sgd_iter=1,
        entropy_coeff=0.5,
        entropy_coeff_schedule=SCHEDULE,
    )
    cfg.resources.num_envs_per_worker = 4
    algo = cfg.build()
    try:
        for _ in range(4):
            sampled_before = algo.counters["env_steps_sampled"]
            r = algo.train()
            # PPO learns each batch after sampling it: the weight of the env steps sampled by then
            got = algo.policies.only.learner.loss_fn.entropy_coeff
            assert got == pytest.approx(expected(r["env_steps_sampled"])), (sampled_before, r["env_steps_sampled"])
            assert r["learner/entropy_coeff"] == pytest.approx(got)
        assert r["env_steps_sampled"] > 1000 and got < 0.02
    finally:
        algo.stop()


def test_appo_moves_the_weight_and_update_config_cannot_fight_the_schedule():
    cfg = APPOConfig(
        env="CartPole-v1", seed=0, train_batch_size=200, min_time_s_per_iteration=0.0, entropy_coeff_schedule=SCHEDULE
    )
    cfg.resources.num_envs_per_worker = 4
    algo = cfg.build()
    try:
        seen = []
        while algo.counters["env_steps_sampled"] < 3500:
            r = algo.train()
            seen.append(r["learner/entropy_coeff"])
        assert seen[0] > seen[-1] == 0.0 and all(a >= b for a, b in zip(seen, seen[1:])), seen
        with pytest.raises(ConfigError, match="entropy_coeff_schedule is set"):
            algo.update_config({"entropy_coeff": 0.3})
        algo.update_config({"vf_loss_coeff": 0.25})  # another change keeps the scheduled weight
        loss = algo.policies.only.learner.loss_fn
        assert loss.vf_loss_coeff == 0.25 and loss.entropy_coeff == 0.0
    finally:
        algo.stop()


def test_the_league_learners_follow_the_schedule():
    from test_alpha_star import small  # the league tests' small tic-tac-toe league

    algo = small(
        league="no_league", max_num_policies_to_train=1, entropy_coeff_schedule=[[0, 0.1], [1200, 0.0]]
    ).build()
    try:
        seen = [algo.train()["learner/main/entropy_coeff"] for _ in range(5)]
        assert seen[0] < 0.1 and all(a >= b for a, b in zip(seen, seen[1:])) and seen[-1] == 0.0, seen
    finally:
        algo.stop()
