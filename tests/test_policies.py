"""PolicySet: rows, stats, result keys and weights by policy id, with the single-agent layout
kept for one policy; AsyncPipeline's train batches per policy."""

from __future__ import annotations

import queue

import numpy as np
import pytest

from shoal.batch import Batch, Col
from shoal.framework.pipeline import AsyncPipeline
from shoal.framework.policies import DEFAULT_POLICY, PolicySet
from shoal.framework.runner import ThreadRunner
from shoal.learn.learner_thread import policy_steps


class _Learner:
    def __init__(self, w: float) -> None:
        self.w = {"x": np.full(2, w)}

    def get_weights(self):
        return self.w


def _rows(n: int, start: int = 0) -> Batch:
    return Batch({Col.VALID: np.ones(n, dtype=bool), "x": np.arange(start, start + n)})


def test_one_policy_keeps_the_single_agent_layout():
    ps = PolicySet.single(None, _Learner(1.0))
    out = ps.batches([_rows(2), _rows(3, 2)])
    assert list(out) == [DEFAULT_POLICY] and out[DEFAULT_POLICY]["x"].tolist() == [0, 1, 2, 3, 4]
    assert ps.result_keys({DEFAULT_POLICY: {"kl": 0.5}}) == {"learner/kl": 0.5}
    assert ps.display([("learner/vf_loss", "vf_loss")]) == [("learner/vf_loss", "vf_loss")]
    assert ps.get_weights()["x"].tolist() == [1.0, 1.0]  # the weights themselves, not keyed by id
    assert ps.batches([]) == {}


def test_several_policies_key_rows_stats_results_and_weights_by_id():
    frozen = {"x": np.zeros(2)}
    ps = PolicySet(
        {"a": None, "b": None, "c": None}, {"a": _Learner(1.0), "b": _Learner(2.0)}, {"c": frozen}, multi=True
    )
    assert ps.ids == ["a", "b", "c"] and [pid for pid, _ in ps] == ["a", "b"]
    out = ps.batches([{"a": _rows(2), "b": _rows(1)}, {"a": _rows(3, 2)}])
    assert {pid: b["x"].tolist() for pid, b in out.items()} == {"a": [0, 1, 2, 3, 4], "b": [0]}
    assert ps.result_keys({"a": {"kl": 1.0}, "b": {"kl": 2.0}}) == {"learner/a/kl": 1.0, "learner/b/kl": 2.0}
    assert ps.display([("learner/vf_loss", "vf_loss")]) == [("learner/a/vf_loss", "a/vf_loss")]
    w = ps.get_weights()
    assert list(w) == ["a", "b", "c"] and w["b"]["x"].tolist() == [2.0, 2.0] and w["c"] is frozen
    with pytest.raises(AttributeError, match="one learner per policy"):
        _ = ps.only


def test_a_set_whose_learners_are_elsewhere_keeps_copies_and_the_league_checkpoint_layout():
    """The league's set: the driver's copy of each learning policy's weights and the frozen ones,
    policies joining, freezing and leaving mid-run, every player's weights under ``weights``."""
    ps = PolicySet.learning_elsewhere()
    w = {p: {"x": np.full(2, float(i))} for i, p in enumerate(["main", "exploiter", "snapshot", "random"])}
    ps.add("main", None, w["main"], learning=True)
    ps.add("exploiter", None, w["exploiter"], learning=True)
    ps.add("random", None, w["random"], learning=False)
    with pytest.raises(ValueError, match="already"):
        ps.add("main", None, w["main"], learning=True)
    assert ps.learning == ["main", "exploiter"] and list(ps.frozen) == ["random"]
    ps.set_weights("main", {"x": np.full(2, 5.0)})  # a learner's result: the driver's copy
    ps.add("snapshot", None, ps.weights("main"), learning=False)
    ps.freeze("exploiter")
    assert ps.learning == ["main"] and ps.weights("exploiter") is w["exploiter"]
    assert ps.remove("random") is w["random"]
    assert list(ps.get_weights()) == ["main", "exploiter", "snapshot"] and ps.weights("snapshot")["x"][0] == 5.0
    state = ps.get_state()
    assert set(state) == {"weights"} and state["weights"]["main"]["x"].tolist() == [5.0, 5.0]
    ps.set_weights("snapshot", {"x": np.zeros(2)})
    ps.set_state(state)
    assert ps.weights("snapshot")["x"].tolist() == [5.0, 5.0]
    with pytest.raises(KeyError, match="unknown policy"):
        ps.set_weights("random", w["random"])
    with pytest.raises(ValueError, match="learners are its own"):
        PolicySet({}, {}, {}, multi=True).add("p", None, w["main"], learning=True)


class _Thread:
    """The learner thread's driver side: a bounded in-queue; ``items`` is what the learner took."""

    def __init__(self, queue_size: int = 100, multi_agent: bool = False) -> None:
        self.multi_agent = multi_agent
        self.inqueue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.num_dropped = 0
        self.ident = 1  # started
        self.taken: list = []

    def add(self, item) -> bool:
        steps = sum(env for env, _ in policy_steps(item).values())  # what the real thread counts
        try:
            self.inqueue.put_nowait((item, steps))
        except queue.Full:
            self.num_dropped += 1
            return False
        return True

    def learn(self, n: int) -> None:
        for _ in range(n):
            self.taken.append(self.inqueue.get_nowait())

    @property
    def items(self) -> list:
        while not self.inqueue.empty():
            self.learn(1)
        return self.taken


class _Runners:
    def __init__(self) -> None:
        self.submitted = 0

    def submit(self, method, prelude=None) -> None:
        self.submitted += 1

    def fetch_ready(self, timeout_s: float) -> list:
        return []


def test_async_pipeline_cuts_each_policys_train_batches_from_its_own_rows():
    thread = _Thread(multi_agent=True)
    runner = ThreadRunner(thread, {"a": _Learner(1.0), "b": _Learner(2.0)})
    p = AsyncPipeline(None, runner, train_batch_size=4, broadcast_interval=1)
    p.enqueue([{"a": _rows(6), "b": _rows(2)}])  # a: one batch, 2 rows wait; b: 2 rows wait
    p.enqueue([{"a": _rows(6, 6), "b": _rows(2, 2)}])  # a: 8 rows -> two batches; b: 4 -> one
    got = [({pid: b["x"].tolist() for pid, b in item.items()}, steps) for item, steps in thread.items]
    assert got == [
        ({"a": [0, 1, 2, 3]}, 4),
        ({"a": [4, 5, 6, 7], "b": [0, 1, 2, 3]}, 8),  # the batches cut in one step travel together
        ({"a": [8, 9, 10, 11]}, 4),
    ]
    assert p.pending_rows == {"a": 0, "b": 0}


def test_async_pipeline_with_one_policy_offers_plain_batches():
    thread = _Thread()
    p = AsyncPipeline(
        None, ThreadRunner(thread, {DEFAULT_POLICY: _Learner(1.0)}), train_batch_size=4, broadcast_interval=1
    )
    p.enqueue([_rows(3), _rows(3, 3)])
    assert [(item["x"].tolist(), steps) for item, steps in thread.items] == [([0, 1, 2, 3], 4)]
    assert p.pending_rows[DEFAULT_POLICY] == 2


def test_async_pipeline_holds_back_what_the_learner_queue_has_no_room_for():
    """A sample result that cuts into more train batches than the learner's queue holds: the
    rest wait in the driver, in order, none is dropped, and no new sample request goes out
    while a sample result's worth (max_ready) waits."""
    thread, runners = _Thread(queue_size=2), _Runners()
    runner = ThreadRunner(thread, {DEFAULT_POLICY: _Learner(1.0)})
    p = AsyncPipeline(runners, runner, train_batch_size=4, broadcast_interval=1, max_ready=3)
    p.sample()
    assert runners.submitted == 1
    p.enqueue([_rows(20)])  # five batches: two fit the queue, three wait
    assert thread.inqueue.qsize() == 2 and len(p.ready) == 3 and thread.num_dropped == 0
    assert p.metrics()["learner_backlog"] == 3
    p.sample()
    assert runners.submitted == 1  # back-pressure: three (max_ready) wait
    thread.learn(1)
    p.enqueue([])  # one place freed: the oldest waiting batch takes it
    assert len(p.ready) == 2 and thread.num_dropped == 0
    p.sample()
    assert runners.submitted == 2  # below max_ready: sampling goes on
    assert [item["x"].tolist()[0] for item, _ in thread.items] == [0, 4, 8]
    p.enqueue([])
    assert [item["x"].tolist()[0] for item, _ in thread.items] == [0, 4, 8, 12, 16]
    assert not p.ready and thread.num_dropped == 0
