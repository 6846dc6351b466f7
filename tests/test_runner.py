"""Learner runners: the protocol's in-driver placement (LocalRunner) on hand-made learners, and
the replay algorithms driving it (priorities of a replayed batch reach its rows)."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.batch import Col
from shoal.learn.runner import Learned, LocalRunner
from shoal.learn.threads import ReplayTag


class _Learner:
    """A policy learner that records what the runner asks of it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[str] = []

    def after_update(self, stats) -> None:
        self.calls.append("after_update")
        stats["after"] = len(self.calls)

    def get_weights(self):
        return {"w": np.array([len(self.name)])}


def _learn(learner, batch) -> Learned:
    learner.calls.append(f"learn {batch}")
    return Learned({"loss": float(batch)}, env_steps=batch)


def test_each_submit_learns_once_then_runs_the_post_update_phase_and_reports_its_policy():
    a, b = _Learner("a"), _Learner("bb")
    runner = LocalRunner({"a": a, "b": b}, _learn)
    assert runner.submit("a", 3) and runner.submit("b", 5) and runner.submit("a", 7, env_steps=2)
    out = runner.results()
    assert [(r.policy_id, r.env_steps, r.agent_steps, r.stats["loss"]) for r in out] == [
        ("a", 3, 3, 3.0),
        ("b", 5, 5, 5.0),
        ("a", 2, 2, 7.0),  # the caller's count wins (e.g. valid rows it knows)
    ]
    assert a.calls == ["learn 3", "after_update", "learn 7", "after_update"]  # post-update right after each
    assert [r.stats["after"] for r in out] == [2, 2, 4]  # the result holds what the phase wrote
    assert runner.results() == [] and runner.num_updates == 3
    assert runner.get_weights("b")["w"][0] == 2


def test_policies_come_and_go():
    runner = LocalRunner({}, _learn)
    runner.add_policy("p", _Learner("p"))
    with pytest.raises(ValueError, match="already learns here"):
        runner.add_policy("p", _Learner("p"))
    runner.submit("p", 1)
    runner.remove_policy("p")
    assert runner.results() == []  # a removed policy's pending results go with it
    with pytest.raises(KeyError):
        runner.submit("p", 1)
    with runner.hold():
        runner.check()


def test_a_replayed_batch_reports_its_priorities_and_slots():
    tag = ReplayTag(0, 0, np.array([4, 9]), None)

    def learn(learner, batch) -> Learned:
        return Learned({}, 2, np.array([0.5, 1.5]), tag)

    runner = LocalRunner({"default": _Learner("x")}, learn)
    runner.submit("default", "batch")
    (r,) = runner.results()
    assert r.policy_id == "default" and r.replay is tag and r.priorities.tolist() == [0.5, 1.5]


def test_dqn_learns_through_its_runner_and_the_new_priorities_reach_the_replayed_rows():
    from shoal.algorithms.dqn import DQNConfig

    algo = DQNConfig(
        env="CartPole-v1", seed=0, learning_starts=64, train_batch_size=16, min_time_s_per_iteration=0
    ).build()
    try:
        calls = []
        learn = algo.runner.learn
        algo.runner.learn = lambda pl, batch: calls.append(batch[Col.INDICES].copy()) or learn(pl, batch)
        updated = []
        update = algo.replay.update_priorities
        algo.replay.update_priorities = lambda idx, td: updated.append(np.asarray(idx).copy()) or update(idx, td)
        for _ in range(20):
            r = algo.train()
            if calls:
                break
        assert calls and len(updated) == len(calls)
        assert all(np.array_equal(u, c) for u, c in zip(updated, calls))  # each batch's priorities, its slots
        assert r["env_steps_trained"] == 16 * len(calls) == algo.runner.num_updates * 16
        assert "learner/kl_coeff" not in r  # DQN's loss has no KL penalty: no coefficient reported
    finally:
        algo.stop()
