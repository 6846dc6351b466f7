"""LearnerThread: order of learning, SGD passes, out-queue, idling, failure surfacing, stats."""

from __future__ import annotations

import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from shoal.batch import Batch, Col
from shoal.errors import ConfigError
from shoal.learn import Learner
from shoal.learn.learner_thread import LearnerThread
from shoal.learn.threads import LearnerQueueTimeout, LearnerThreadError

BATCH_ID = "test_batch_id"  # a test-only column: which batch a row came from


def mse_loss(module, batch, learner):
    pred = module(batch[Col.OBS]).squeeze(-1)
    loss = ((pred - batch[Col.VALUE_TARGETS]) ** 2).mean()
    return loss, {"loss": loss.detach()}


def make_learner(seed: int = 0, loss_fn=mse_loss) -> Learner:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return Learner(net, loss_fn, lr=1e-2)


def make_batch(i: int, rows: int = 8) -> Batch:
    rng = np.random.default_rng(i)
    obs = rng.normal(size=(rows, 3)).astype(np.float32)
    return Batch(
        {Col.OBS: obs, Col.VALUE_TARGETS: obs.sum(1).astype(np.float32), BATCH_ID: np.full(rows, i, dtype=np.int64)}
    )


class Recorder:
    """A loss that remembers which batch each SGD pass saw."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def __call__(self, module, batch, learner):
        self.seen.append(int(batch[BATCH_ID][0]))
        return mse_loss(module, batch, learner)


def drain(q: queue.Queue, n: int, timeout_s: float = 10.0) -> list:
    """The next ``n`` results as (env_steps, agent_steps, stats)."""
    out = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n:
        r = q.get(timeout=max(0.01, deadline - time.monotonic()))
        out.append((r.env_steps, r.agent_steps, r.stats))
    return out


@pytest.fixture
def threads():
    started: list[LearnerThread] = []
    yield started
    for t in started:
        t.stop()


def start(threads, learner, **kw) -> LearnerThread:
    t = LearnerThread(learner, **kw)
    threads.append(t)
    t.start()
    return t


def test_batches_are_learned_in_queue_order(threads):
    rec = Recorder()
    t = LearnerThread(make_learner(loss_fn=rec), minibatch_buffer_size=1, num_sgd_iter=1)
    threads.append(t)
    for i in range(6):  # queued before the thread starts, so the order is fixed
        assert t.add(make_batch(i))
    t.start()
    drain(t.outqueue, 6)
    assert rec.seen == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    "num_sgd_iter,buffer_size,expected",
    [
        (1, 1, [0, 1, 2, 3]),
        (3, 1, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]),
        (2, 2, [0, 1, 0, 1, 2, 3, 2, 3]),
        (3, 2, [0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3]),
        (1, 2, [0, 1, 2, 3]),
        (2, 4, [0, 1, 2, 3, 0, 1, 2, 3]),
    ],
)
def test_each_batch_gets_num_sgd_iter_passes_in_ring_order(threads, num_sgd_iter, buffer_size, expected):
    rec = Recorder()
    learner = make_learner(loss_fn=rec)
    t = LearnerThread(learner, minibatch_buffer_size=buffer_size, num_sgd_iter=num_sgd_iter)
    threads.append(t)
    for i in range(4):
        t.add(make_batch(i))
    t.start()
    drain(t.outqueue, 4)
    assert rec.seen == expected
    assert t.num_updates == learner.num_updates == 4 * num_sgd_iter
    time.sleep(0.1)
    assert t.outqueue.empty() and len(rec.seen) == 4 * num_sgd_iter  # nothing learned beyond that


def test_outqueue_holds_steps_and_info_per_batch(threads):
    t = start(threads, make_learner(), num_sgd_iter=2)
    t.add(make_batch(0, rows=8))
    t.add(make_batch(1, rows=12))
    (e0, a0, info0), (e1, a1, info1) = drain(t.outqueue, 2)
    assert (e0, a0, e1, a1) == (8, 8, 12, 12)
    assert set(info0) == {"loss"} and isinstance(info0["loss"], float) and info0["loss"] > 0


def test_info_is_the_mean_over_the_passes(threads):
    learner = make_learner()
    ref = make_learner()  # same init: replay the passes by hand
    t = start(threads, learner, num_sgd_iter=3)
    t.add(make_batch(5))
    _, _, info = drain(t.outqueue, 1)[0]
    tensors = make_batch(5).to_torch()
    losses = [float(ref.update_minibatch(tensors)["loss"]) for _ in range(3)]
    assert info["loss"] == pytest.approx(np.mean(losses), rel=1e-5)
    for k, v in t.get_weights().items():
        np.testing.assert_allclose(v, ref.get_weights()[k], rtol=1e-5, atol=1e-6)


def test_add_does_not_block_and_reports_a_full_queue():
    t = LearnerThread(make_learner(), learner_queue_size=2)  # not started: nothing drains the queue
    assert t.add(make_batch(0)) and t.add(make_batch(1))
    t0 = time.perf_counter()
    assert t.add(make_batch(2)) is False
    assert time.perf_counter() - t0 < 0.05
    assert t.inqueue.maxsize == 2 and t.inqueue.qsize() == 2


def _thread_cpu_ticks(t: threading.Thread) -> int:
    fields = Path(f"/proc/self/task/{t.native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14 and 15 of stat)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads per-thread CPU time from /proc")
def test_idle_thread_blocks_in_queue_get_without_spinning(threads):
    t = start(threads, make_learner())
    time.sleep(0.2)
    t.busy_fraction()  # open a fresh window
    ticks0 = _thread_cpu_ticks(t)
    time.sleep(1.0)
    assert _thread_cpu_ticks(t) - ticks0 <= 2  # 2 clock ticks = 20 ms of CPU in 1 s at most
    frames = []
    f = sys._current_frames()[t.ident]
    while f is not None:
        frames.append((Path(f.f_code.co_filename).name, f.f_code.co_name))
        f = f.f_back
    assert ("queue.py", "get") in frames
    assert t.stats()["learner_idle_fraction"] > 0.95


def test_busy_thread_reports_low_idle_fraction(threads):
    def slow_loss(module, batch, learner):
        time.sleep(0.02)
        return mse_loss(module, batch, learner)

    t = LearnerThread(make_learner(loss_fn=slow_loss), num_sgd_iter=5)
    threads.append(t)
    for i in range(8):
        t.add(make_batch(i))
    t.start()
    t.busy_fraction()
    time.sleep(0.4)  # 8 x 5 x 20 ms = 0.8 s of work queued
    assert t.stats()["learner_idle_fraction"] < 0.3


def test_empty_queue_past_the_timeout_surfaces_with_its_cause(threads):
    t = start(threads, make_learner(), learner_queue_timeout=0.3)
    t.join(3.0)
    assert not t.is_alive()
    with pytest.raises(LearnerThreadError) as e:
        t.check()
    assert isinstance(e.value.__cause__, LearnerQueueTimeout)
    msg = str(e.value)
    assert "LearnerQueueTimeout" in msg and "learner_queue_timeout=0.3" in msg and "stayed empty" in msg


def test_a_loss_that_raises_surfaces_with_its_traceback(threads):
    def broken_loss(module, batch, learner):
        raise RuntimeError("the loss exploded on purpose")

    t = start(threads, make_learner(loss_fn=broken_loss))
    t.check()  # alive and waiting: nothing to report
    t.add(make_batch(0))
    t.join(3.0)
    with pytest.raises(LearnerThreadError) as e:
        t.check()
    msg = str(e.value)
    assert "the loss exploded on purpose" in msg and "broken_loss" in msg and "Traceback" in msg
    assert isinstance(e.value.__cause__, RuntimeError)


def test_stop_is_prompt_while_waiting():
    t = LearnerThread(make_learner())
    t.start()
    time.sleep(0.05)
    t0 = time.perf_counter()
    t.stop()
    assert not t.is_alive() and time.perf_counter() - t0 < 0.3
    t.check()  # stopped on purpose: no error


def test_stats_keys_and_values(threads):
    t = start(threads, make_learner(), num_sgd_iter=2)
    for i in range(3):
        t.add(make_batch(i))
    drain(t.outqueue, 3)
    s = t.stats()
    assert set(s) == {
        "learner_queue_size_mean",
        "learner_queue_size_max",
        "timers/learner_queue_wait_ms",
        "timers/learner_load_ms",
        "timers/learner_load_wait_ms",
        "timers/learner_grad_ms",
        "learner_idle_fraction",
        "num_updates",
    }
    assert s["num_updates"] == 6.0
    assert s["timers/learner_grad_ms"] > 0 and 0.0 <= s["learner_idle_fraction"] <= 1.0
    assert 0.0 <= s["learner_queue_size_mean"] <= s["learner_queue_size_max"] <= 2.0
    assert all(isinstance(v, float) for v in s.values())


def test_get_weights_is_consistent_while_training(threads):
    learner = make_learner()
    t = LearnerThread(learner, num_sgd_iter=50)
    threads.append(t)
    updates_inside = []
    orig = learner.apply_gradients

    def slow_apply():  # widen the window in which a weight read could see a half-applied step
        n = orig()
        updates_inside.append(1)
        time.sleep(0.001)
        return n

    learner.apply_gradients = slow_apply
    for i in range(4):
        t.add(make_batch(i))
    t.start()
    reads = 0
    while t.num_updates < 200 and reads < 2000:
        with t.hold():  # the same lock the thread holds across an update
            before = learner.num_updates
            w = t.get_weights()
            assert learner.num_updates == before
        assert set(w) == {"0.weight", "0.bias", "2.weight", "2.bias"}
        reads += 1
    drain(t.outqueue, 4)
    assert reads > 10 and len(updates_inside) == 200


def test_multi_agent_batches_update_each_policy(threads):
    learners = {"a": make_learner(0), "b": make_learner(1)}
    before = {pid: ln.get_weights() for pid, ln in learners.items()}
    t = start(threads, learners)
    b = make_batch(1, rows=6)
    b.data[Col.VALID] = np.array([1, 1, 0, 1, 1, 1], dtype=bool)  # a reset row kept inside a sequence
    assert t.add({"a": make_batch(0, rows=4), "b": b})
    assert t.add({"a": make_batch(2, rows=4)})
    results = [t.outqueue.get(timeout=10.0) for _ in range(3)]  # one result per policy and batch
    got = [(r.policy_id, r.env_steps, r.agent_steps, set(r.stats)) for r in results]
    assert got == [("a", 4, 4, {"loss"}), ("b", 5, 6, {"loss"}), ("a", 4, 4, {"loss"})]  # env steps: valid rows
    assert learners["a"].num_updates == 2 and learners["b"].num_updates == 1
    w = t.get_weights()
    assert set(w) == {"a", "b"}
    assert not np.allclose(w["b"]["0.weight"], before["b"]["0.weight"])
    np.testing.assert_array_equal(t.get_weights("a")["2.bias"], w["a"]["2.bias"])
    with pytest.raises(TypeError, match="multi-agent"):
        t.add(make_batch(0))


def test_unknown_policy_in_a_batch_kills_the_thread_with_a_clear_error(threads):
    t = start(threads, {"a": make_learner()})
    t.add({"z": make_batch(0)})
    t.join(3.0)
    with pytest.raises(LearnerThreadError, match="policy 'z'"):
        t.check()


@pytest.mark.parametrize(
    "key,value",
    [("learner_queue_size", 0), ("minibatch_buffer_size", -1), ("num_sgd_iter", 1.5), ("learner_queue_timeout", 0)],
)
def test_bad_settings_are_config_errors_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=key):
        LearnerThread(make_learner(), **{key: value})
