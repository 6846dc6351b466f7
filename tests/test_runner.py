"""Learner runners: the protocol's in-driver placement (LocalRunner) on hand-made learners, and
the replay algorithms driving it (priorities of a replayed batch reach its rows)."""

from __future__ import annotations

import numpy as np
import pytest

from shoal.batch import Col
from shoal.framework.runner import Learned, LocalRunner
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
    assert runner.submit({"a": 3, "b": 5}) and runner.submit({"a": 7})
    out = runner.results()
    assert [(r.policy_id, r.env_steps, r.agent_steps, r.stats["loss"]) for r in out] == [
        ("a", 3, 3, 3.0),
        ("b", 5, 5, 5.0),
        ("a", 7, 7, 7.0),
    ]
    assert a.calls == ["learn 3", "after_update", "learn 7", "after_update"]  # post-update right after each
    assert [r.stats["after"] for r in out] == [2, 2, 4]  # the result holds what the phase wrote
    assert runner.results() == []
    assert runner.get_weights("b")["w"][0] == 2


def test_policies_come_and_go():
    runner = LocalRunner({}, _learn)
    runner.add_policy("p", _Learner("p"))
    with pytest.raises(ValueError, match="already learns here"):
        runner.add_policy("p", _Learner("p"))
    runner.submit({"p": 1})
    runner.remove_policy("p")
    assert runner.results() == []  # a removed policy's pending results go with it
    with pytest.raises(KeyError):
        runner.submit({"p": 1})
    with runner.hold():
        runner.check()


def test_a_replayed_batch_reports_its_priorities_and_slots():
    tag = ReplayTag(0, 0, np.array([4, 9]), None)

    def learn(learner, batch) -> Learned:
        return Learned({}, 2, np.array([0.5, 1.5]), tag)

    runner = LocalRunner({"default": _Learner("x")}, learn)
    runner.submit({"default": "batch"})
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
        assert r["env_steps_trained"] == 16 * len(calls)
        assert "learner/kl_coeff" not in r  # DQN's loss has no KL penalty: no coefficient reported
    finally:
        algo.stop()


# ---- a learner thread behind the protocol ---------------------------------------------------------
def _thread_learner(seed: int):
    import torch

    from shoal.learn import Learner

    def loss(module, batch, learner):
        out = ((module(batch[Col.OBS]).squeeze(-1) - batch[Col.VALUE_TARGETS]) ** 2).mean()
        return out, {"loss": out.detach()}

    torch.manual_seed(seed)
    return Learner(torch.nn.Linear(3, 1), loss, lr=1e-2)


def _batch(rows: int, valid: int | None = None):
    from shoal.batch import Batch

    obs = np.ones((rows, 3), np.float32)
    mask = np.arange(rows) < (rows if valid is None else valid)
    return Batch({Col.OBS: obs, Col.VALUE_TARGETS: np.zeros(rows, np.float32), Col.VALID: mask})


class _Policy(_Learner):
    """A policy learner around a real Learner, recording its post-update phases."""

    def __init__(self, name: str, seed: int) -> None:
        super().__init__(name)
        self.learner = _thread_learner(seed)


def _results(runner, n: int) -> list:
    import time

    out: list = []
    deadline = time.monotonic() + 20
    while len(out) < n and time.monotonic() < deadline:
        out += runner.results(timeout_s=0.1)
    return out


def test_a_thread_runner_reports_each_policy_and_runs_its_post_update_phase_in_the_driver():
    from shoal.framework.runner import ThreadRunner
    from shoal.learn.learner_thread import LearnerThread

    a, b = _Policy("a", 0), _Policy("b", 1)
    thread = LearnerThread({"a": a.learner, "b": b.learner})
    runner = ThreadRunner(thread, {"a": a, "b": b})
    thread.start()
    try:
        assert runner.submit({"a": _batch(4), "b": _batch(6, valid=5)})
        out = _results(runner, 2)
        assert [(r.policy_id, r.env_steps, r.agent_steps) for r in out] == [("a", 4, 4), ("b", 5, 6)]
        assert a.calls == b.calls == ["after_update"] and out[1].stats["after"] == 1
        c = _Policy("c", 2)
        runner.add_policy("c", c)  # joins the running thread
        assert runner.submit({"c": _batch(2)})
        (r,) = _results(runner, 1)
        assert r.policy_id == "c" and c.learner.num_updates == 1
        runner.remove_policy("b")
        assert set(thread.learners) == {"a", "c"} and set(runner.learners) == {"a", "c"}
        assert runner.submit({"a": _batch(4)})
        assert [r.policy_id for r in _results(runner, 1)] == ["a"]
        with pytest.raises(ValueError, match="already learns here"):
            runner.add_policy("a", a)
        runner.check()
    finally:
        runner.stop()


def test_a_single_policy_thread_runner_names_its_policy():
    from shoal.framework.runner import ThreadRunner
    from shoal.learn.learner_thread import LearnerThread

    p = _Policy("p", 0)
    runner = ThreadRunner(LearnerThread(p.learner), {"default": p})
    runner.thread.start()
    try:
        with pytest.raises(KeyError, match="trains policy 'default' only"):
            runner.submit({"other": _batch(4)})
        assert runner.submit({"default": _batch(8, valid=6)})
        (r,) = _results(runner, 1)
        assert (r.policy_id, r.env_steps, r.agent_steps) == ("default", 6, 8) and p.calls == ["after_update"]
        with pytest.raises(ValueError, match="single-policy learner thread"):
            runner.add_policy("q", _Policy("q", 1))
        with pytest.raises(ValueError, match="cannot leave"):
            runner.remove_policy("default")
        assert runner.get_weights("default")["w"].tolist() == [1]  # the policy learner's, under the thread's lock
    finally:
        runner.stop()


class _Group:
    """A learner group's driver side: records rounds, answers results with learner 0's stats."""

    started = True
    num_learners = 2

    def __init__(self) -> None:
        self.rounds: list = []
        self.pending: list = []

    def add(self, rounds, sampled_steps: int) -> bool:
        self.rounds.append((rounds, sampled_steps))
        return True

    def drain(self, timeout_s: float = 0.0) -> list:
        from shoal.learn.threads import LearnerResult

        out, self.pending = self.pending, []
        return [LearnerResult(n, n, {"kl_coeff": k}) for n, k in out]

    def check(self) -> None:
        pass


def test_a_group_runner_hands_rounds_over_and_mirrors_the_members_kl_coefficient():
    from shoal.framework.runner import GroupRunner

    class _KL:
        coeff = 1.0

    p = _Learner("p")
    p.kl = _KL()
    group, sampled = _Group(), [100]
    runner = GroupRunner(group, {"default": p}, lambda: sampled[0])
    assert runner.submit({"default": [["ref0"], ["ref1"]]})
    assert group.rounds == [([["ref0"], ["ref1"]], 100)]  # each learner's references, with the sampled steps
    group.pending = [(32, 1.5), (32, 2.25)]
    out = runner.results()
    assert [r.policy_id for r in out] == ["default", "default"] and p.kl.coeff == 2.25
    assert p.calls == []  # the members ran the post-update phase; the driver only mirrors it
    with pytest.raises(KeyError):
        runner.submit({"other": []})
    with pytest.raises(ValueError, match="fixed set of policies"):
        runner.add_policy("q", _Learner("q"))
    with pytest.raises(ValueError, match="trains one policy"):
        GroupRunner(group, {"a": p, "b": p}, lambda: 0)


def test_a_group_runner_gives_each_policy_its_own_group_and_rounds():
    from shoal.framework.learner_group import LearnerGroups
    from shoal.framework.runner import GroupRunner

    class _KL:
        coeff = 1.0

    a, b = _Learner("a"), _Learner("b")
    a.kl, b.kl = _KL(), _KL()
    ga, gb = _Group(), _Group()
    runner = GroupRunner(LearnerGroups({"a": ga, "b": gb}), {"a": a, "b": b}, lambda: 7)
    assert runner.single_policy is None and runner.policy_ids == ["a", "b"]
    assert runner.submit({"b": [["r0"], ["r1"]]})  # one policy's round, the other's group untouched
    assert gb.rounds == [([["r0"], ["r1"]], 7)] and ga.rounds == []
    ga.pending, gb.pending = [(16, 0.5)], [(32, 3.0)]
    out = runner.results()
    assert sorted((r.policy_id, r.env_steps) for r in out) == [("a", 16), ("b", 32)]
    assert (a.kl.coeff, b.kl.coeff) == (0.5, 3.0)  # each driver copy mirrors its own group
    with pytest.raises(ValueError, match="fixed set of policies"):
        runner.add_policy("c", _Learner("c"))
    with pytest.raises(ValueError, match="cannot leave"):
        runner.remove_policy("a")
    with pytest.raises(ValueError, match="the learning policies are"):
        GroupRunner(LearnerGroups({"a": ga}), {"a": a, "b": b}, lambda: 0)


class _Shards:
    """The league's learner shards as the runner sees them: learn requests in, outputs out."""

    def __init__(self) -> None:
        self.policy_ids = ["main", "exploiter"]
        self.asked: list = []
        self.ready: list = []
        self.added: list = []

    def submit(self, pid, method, env_steps) -> bool:
        self.asked.append((pid, method, env_steps))
        return pid != "exploiter"  # its last request is still open

    def fetch_ready(self, timeout_s: float) -> list:
        out, self.ready = self.ready, []
        return out

    def add_policy(self, pid, args, weights=None) -> None:
        self.added.append((pid, args, weights))
        self.policy_ids.append(pid)


def test_a_shard_runner_asks_each_learner_to_learn_and_returns_their_weights():
    from shoal.framework.runner import RemoteLearner, ShardRunner
    from shoal.learn.threads import LearnerResult

    shards = _Shards()
    runner = ShardRunner(shards)
    assert not runner.submit({"main": 1200, "exploiter": 1200})  # one learner still busy: not every one took it
    assert shards.asked == [("main", "learn", 1200), ("exploiter", "learn", 1200)]
    w = {"w": np.zeros(2)}
    shards.ready = [
        ("main", LearnerResult(64, 64, {"loss": 0.5}, policy_id="main", weights=w)),
        ("exploiter", None),
        ("gone", LearnerResult(8, 8, {}, policy_id="gone", weights=w)),
    ]
    (r,) = runner.results()  # nothing replayed yet, and a policy that left meanwhile: no result
    assert (r.policy_id, r.env_steps, r.stats, r.weights) == ("main", 64, {"loss": 0.5}, w)
    runner.add_policy("snapshot", RemoteLearner(("cfg",), w))
    assert shards.added == [("snapshot", ("cfg",), w)]


def test_a_policy_that_leaves_a_running_thread_mid_batch_is_skipped_not_a_crash():
    """Its batch part-learned (three passes each) and others still queued: the thread goes on
    with the others, and no result names the policy that left after it left."""
    import time

    from shoal.framework.runner import ThreadRunner
    from shoal.learn.learner_thread import LearnerThread

    a, b = _Policy("a", 0), _Policy("b", 1)
    thread = LearnerThread({"a": a.learner, "b": b.learner}, num_sgd_iter=3)
    runner = ThreadRunner(thread, {"a": a, "b": b})
    for _ in range(3):
        assert runner.submit({"a": _batch(4), "b": _batch(4)})
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while b.learner.num_updates == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        runner.remove_policy("b")  # some of b's passes done, others still owed
        out = _results(runner, 3)
        time.sleep(0.2)
        out += runner.results()
        runner.check()  # the thread is alive
        assert {r.policy_id for r in out} <= {"a", "b"} and [r.policy_id for r in out].count("a") == 3
        late = [r for r in out if r.policy_id == "b"]
        assert all(r.stats for r in late)  # only results the thread finished before "b" left
        assert b.calls == []  # ...and no post-update phase ran for the departed policy
    finally:
        runner.stop()


# ---- rollout workers that sample and learn (DD-PPO's placement) ------------------------------------
class _RoundWorker:
    """A rollout worker that learns, as the runner sees it: each round samples 16 rows (row 5 a
    reset row inside the fragment, masked out), then learns, or fails as ``outcomes`` says."""

    outcomes: dict[int, list[str]] = {}  # worker index -> what its next rounds do: "ok", "collective", "diverged"

    def __init__(self, index: int) -> None:
        self.index, self.rank, self.rounds = index, None, 0
        self.state: dict = {}

    def rendezvous_address(self):
        return ("127.0.0.1", 0)

    def join_group(self, address, ranks) -> None:
        self.rank = ranks[self.index]

    def get_sync_state(self) -> dict:
        return {"learner": f"worker {self.index}'s", "rounds": self.rounds}

    def set_sync_state(self, state) -> None:
        self.state, self.rounds = state, state["rounds"]

    def get_weights(self):
        return {"w": np.array([self.index])}

    def sample_and_train(self):
        from shoal.errors import DivergenceError
        from shoal.framework.runner import WorkerRound
        from shoal.learn.distributed import CollectiveError
        from shoal.learn.threads import LearnerResult
        from shoal.rollout.env_runner import RolloutMetrics

        batch = _batch(16)
        batch[Col.VALID][5] = False
        metrics = RolloutMetrics(env_steps=batch.valid_rows())
        todo = self.outcomes.get(self.index, [])
        outcome = todo.pop(0) if todo else "ok"
        if outcome == "collective":
            return WorkerRound(metrics, CollectiveError(f"worker {self.index}: its peer is gone"))
        if outcome == "diverged":
            return WorkerRound(metrics, DivergenceError("every update was non-finite"))
        self.rounds += 1
        rows = batch.valid_rows()
        weights = self.get_weights() if self.rank == 0 else None
        return WorkerRound(
            metrics, LearnerResult(rows, rows, {"loss": float(self.index)}, weights=weights), self.rounds
        )


class _DriverCopy(_Learner):
    """The driver's copy of the policy: a learner with a state to start a group from."""

    def __init__(self) -> None:
        super().__init__("driver")

        class _State:
            def get_state(self):
                return {"from": "driver"}

        self.learner = _State()


def _worker_runner(outcomes: dict[int, list[str]]):
    from shoal.framework.runner import WorkerRunner
    from shoal.runtime import LocalActorGroup

    _RoundWorker.outcomes = outcomes
    group = LocalActorGroup(_RoundWorker, 2, lambda i: ((i,), {}))
    group.max_restarts = 1  # what form_group retries a formation after a restart mid-way
    driver = _DriverCopy()
    runner = WorkerRunner({"default": driver}, wait_s=5.0)
    runner.start(group)
    return runner, group, driver


def test_a_worker_runner_reports_each_workers_round_as_a_result_of_its_policy():
    runner, group, driver = _worker_runner({})
    assert [w.rank for w in group.actors.values()] == [0, 1] and group.actors[2].state["learner"] == {"from": "driver"}
    with pytest.raises(KeyError, match="sample their own batches"):
        runner.submit({"default": _batch(4)})
    assert runner.submit({"default": None})
    out = runner.results()
    # one result per worker and round, named by policy; env steps: the valid rows (the reset row left out)
    assert [(r.policy_id, r.env_steps, r.agent_steps, r.stats["loss"]) for r in out] == [
        ("default", 15, 15, 1.0),
        ("default", 15, 15, 2.0),
    ]
    assert [r.weights is not None for r in out] == [True, False]  # rank 0's weights only
    assert driver.calls == ["after_update"] * 2 and out[1].stats["after"] == 2  # the phase ran here, per result
    assert [m.env_steps for m in runner.rollouts()] == [15, 15] and runner.rollouts() == []
    assert runner.rounds == 1 and runner.get_weights("default")["w"].tolist() == [1]  # rank 0, settled
    assert runner.sync_state() == {"learner": "worker 1's", "rounds": 1}
    with pytest.raises(ValueError, match="train one policy"):
        runner.add_policy("q", _Learner("q"))
    with pytest.raises(ValueError, match="cannot leave"):
        runner.remove_policy("default")
    with pytest.raises(ValueError, match="train one policy"):
        type(runner)({"a": driver, "b": driver}, wait_s=1.0)
    with runner.hold():
        runner.check()
    runner.stop()
    assert not runner.started and group.actors == {}


def test_a_failed_collective_is_counted_and_the_group_re_formed_from_a_survivor():
    runner, group, _ = _worker_runner({2: ["ok", "collective"]})
    runner.submit({"default": None})
    runner.results()
    first = group.actors[1]
    runner.submit({"default": None})
    (r,) = runner.results()  # worker 2's round failed: no result for it, and no raise
    assert r.stats["loss"] == 1.0 and runner.num_failed_rounds == 1 and len(runner.rollouts()) == 4
    runner.check()
    group.restart(2)  # and the runtime recreated it
    runner.regroup()
    assert runner.num_regroups == 1 and group.actors[1] is first
    assert group.actors[2].state == {"learner": "worker 1's", "rounds": 2}  # the survivor's state
    runner.regroup()
    assert runner.num_regroups == 1  # nothing failed since: nothing to do


def test_a_worker_runner_raises_at_check_when_a_workers_round_diverged():
    from shoal.errors import DivergenceError

    runner, _, _ = _worker_runner({1: ["diverged"]})
    runner.submit({"default": None})
    (r,) = runner.results()  # worker 2 learned; worker 1 diverged
    assert r.stats["loss"] == 2.0 and len(runner.rollouts()) == 2  # its sampling still counts
    with pytest.raises(DivergenceError, match="non-finite"):
        runner.check()
