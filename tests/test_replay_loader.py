"""Ape-X's learner thread with its loader: batches reach ``learn_fn`` already on the device, in
order, with their replay tags; the loader's errors surface; nothing is lost from the count of
batches waiting; and one replayed SGD step returns its priorities and stats in one host copy."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from shoal.batch import Batch, Col
from shoal.learn.loading import copy_to_device
from shoal.learn.replay_learner import Replayed, ReplayLearnerThread
from shoal.learn.threads import LearnerThreadError


def _batch(i: int, rows: int = 4) -> Batch:
    obs = np.full((rows, 2, 3), i, dtype=np.uint8)
    obs.flags.writeable = False  # as a zero-copy view of Ray's object store arrives
    return Batch(
        {
            Col.OBS: obs,
            Col.REWARDS: np.arange(rows, dtype=np.float32) + i,
            Col.INDICES: np.arange(rows) + 10 * i,
            Col.ROW_IDS: np.arange(rows) + 100 * i,
        }
    )


def _wait(pred, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_copy_to_device_on_the_cpu_keeps_dtypes_and_copies_read_only_columns():
    b = _batch(3)
    t = copy_to_device(b, torch.device("cpu"), exclude=(Col.INDICES, Col.ROW_IDS))
    assert set(t) == {Col.OBS, Col.REWARDS}
    assert t[Col.OBS].dtype == torch.uint8 and int(t[Col.OBS][0, 0, 0]) == 3
    t[Col.OBS][0, 0, 0] = 7  # writable, and the batch's array is untouched
    assert b[Col.OBS][0, 0, 0] == 3


def test_loaded_batches_are_learned_in_order_with_their_tags():
    loaded_in: list[str] = []
    seen = []

    def load(batch):
        loaded_in.append(threading.current_thread().name)
        return {"obs": torch.from_numpy(batch[Col.OBS].copy()), "rows": len(batch)}

    def learn(tensors):
        seen.append(int(tensors["obs"][0, 0, 0]))
        return np.full(tensors["rows"], float(seen[-1])), {"loss": float(seen[-1])}

    t = ReplayLearnerThread(learn, dict, queue_size=8, load_fn=load, prefetch=2)
    t.start()
    try:
        for i in range(6):
            assert t.add(Replayed(shard_id=i % 2, generation=1, batch=_batch(i)))
        results = []
        _wait(lambda: (results.extend(t.drain()), len(results) == 6)[1])
        assert seen == list(range(6))
        assert set(loaded_in) == {"shoal-replay-loader"}  # loading happened off the learning thread
        for i, r in enumerate(results):
            assert r.env_steps == r.agent_steps == 4
            assert r.stats == {"loss": float(i)} and r.priorities.tolist() == [float(i)] * 4
            assert r.replay.shard_id == i % 2 and r.replay.generation == 1
            assert r.replay.indices.tolist() == [10 * i + k for k in range(4)]
            assert r.replay.row_ids.tolist() == [100 * i + k for k in range(4)]
        assert t.queued() == 0 and t.num_updates == 6
    finally:
        t.stop()


def test_queued_counts_batches_in_the_queue_the_loader_and_the_ready_slots():
    t = ReplayLearnerThread(lambda tensors: (None, {}), dict, queue_size=8, load_fn=lambda b: b, prefetch=2)
    t.start()
    try:
        with t.lock:  # the learning thread stops before its first step; the loader runs on
            for i in range(7):
                assert t.add(Replayed(0, 0, _batch(i)))
            _wait(lambda: t.ready.full())
            assert t.queued() == 7
            assert t.inqueue.qsize() + t.ready.qsize() <= 7  # one may sit in the loader's hands
        _wait(lambda: t.queued() == 0)
        assert len(t.drain()) == 7
    finally:
        t.stop()


def test_a_loader_that_raises_surfaces_with_its_traceback():
    def load(batch):
        raise RuntimeError("pinned memory exhausted")

    t = ReplayLearnerThread(lambda x: (None, {}), dict, load_fn=load)
    t.start()
    try:
        t.add(Replayed(0, 0, _batch(0)))
        _wait(lambda: t.loader.error is not None)
        with pytest.raises(LearnerThreadError, match="pinned memory exhausted"):
            t.check()
    finally:
        t.stop()


def test_stop_is_prompt_with_batches_loaded_and_waiting():
    t = ReplayLearnerThread(lambda x: (None, {}), dict, queue_size=8, load_fn=lambda b: b, prefetch=1)
    t.start()
    with t.lock:
        for i in range(5):
            t.add(Replayed(0, 0, _batch(i)))
        _wait(lambda: t.ready.full())
    t0 = time.monotonic()
    t.stop()
    assert not t.is_alive() and not t.loader.is_alive()
    assert time.monotonic() - t0 < 4.0  # both threads leave on the stop signal, not on a poll timeout


def test_prefetch_must_be_positive():
    with pytest.raises(ValueError, match="prefetch must be at least 1; got 0"):
        ReplayLearnerThread(lambda x: (None, {}), dict, load_fn=lambda b: b, prefetch=0)


def test_one_replayed_step_returns_priorities_and_stats_in_one_host_copy():
    from shoal.algorithms.dqn import learn_on_replay_tensors

    class FakeLearner:
        device = torch.device("cpu")

        def update_minibatch(self, tensors):
            td = tensors["x"] - 1.0
            return {"td_error": td, "loss": td.pow(2).mean(), "grad_norm": torch.tensor(2.5), "lr": 1e-3}

    x = torch.tensor([0.0, 3.0, -2.0])
    td, stats = learn_on_replay_tensors(FakeLearner(), {"x": x})  # type: ignore[arg-type]
    assert td.tolist() == [1.0, 2.0, 3.0]  # |x - 1|
    assert stats["loss"] == pytest.approx((1 + 4 + 9) / 3)
    assert stats["grad_norm"] == 2.5 and stats["lr"] == pytest.approx(1e-3)
    nan = torch.tensor([0.0, float("nan")])
    td, stats = learn_on_replay_tensors(FakeLearner(), {"x": nan})  # type: ignore[arg-type]
    assert td is None  # a NaN priority keeps the rows' old ones
