"""MultiDeviceLearnerThread on fake CPU devices: same update as one device, stacks, splits, errors."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from test_learner_thread import drain, make_batch, make_learner, mse_loss

from shoal.batch import Batch, Col
from shoal.errors import ConfigError
from shoal.learn.multi_device import MultiDeviceLearnerThread
from shoal.learn.threads import LearnerQueueTimeout, LearnerThreadError

FAKE2 = ["cpu", "cpu"]


@pytest.fixture
def threads():
    started: list[MultiDeviceLearnerThread] = []
    yield started
    for t in started:
        t.stop()


def start(threads, learner, devices=FAKE2, **kw) -> MultiDeviceLearnerThread:
    t = MultiDeviceLearnerThread(learner, devices, **kw)
    threads.append(t)
    t.start()
    return t


def assert_same_weights(a: dict, b: dict, rtol=1e-5, atol=1e-6) -> None:
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=rtol, atol=atol, err_msg=k)


@pytest.mark.parametrize("num_sgd_iter", [1, 3])
def test_two_fake_devices_make_the_same_update_as_one(threads, num_sgd_iter):
    one, two, ref = make_learner(0), make_learner(0), make_learner(0)
    batch = make_batch(7, rows=16)
    t1 = start(threads, one, ["cpu"], num_sgd_iter=num_sgd_iter)
    t2 = start(threads, two, FAKE2, num_sgd_iter=num_sgd_iter)
    t1.add(batch)
    t2.add(batch)
    (_, _, info1), (_, _, info2) = drain(t1.outqueue, 1) + drain(t2.outqueue, 1)
    for _ in range(num_sgd_iter):  # plain single-learner steps on the whole batch
        ref.update_minibatch(batch.to_torch())
    w1, w2 = t1.get_weights(), t2.get_weights()
    assert not np.allclose(w1["0.weight"], make_learner(0).get_weights()["0.weight"])  # it did learn
    assert_same_weights(w1, ref.get_weights())
    assert_same_weights(w2, ref.get_weights())
    assert info1["loss"] == pytest.approx(info2["loss"], rel=1e-5)
    assert one.num_updates == two.num_updates == num_sgd_iter
    replica = t2.towers[None].modules[1]
    assert all(p is not q for p, q in zip(two.module.parameters(), replica.parameters()))


def test_weights_set_on_the_master_between_steps_reach_the_replicas(threads):
    two, ref = make_learner(0), make_learner(0)
    t = start(threads, two, FAKE2)
    restored = make_learner(9).get_state()  # e.g. a checkpoint restored while the thread runs
    with t.lock:
        two.set_state(restored)
    ref.set_state(restored)
    t.add(make_batch(2, rows=8))
    drain(t.outqueue, 1)
    ref.update_minibatch(make_batch(2, rows=8).to_torch())
    assert_same_weights(t.get_weights(), ref.get_weights())


def test_two_devices_match_one_over_many_batches_with_grad_clipping(threads):
    one, two = make_learner(3), make_learner(3)
    one.grad_clip = two.grad_clip = 0.5
    t1 = start(threads, one, ["cpu"], num_sgd_iter=2)
    t2 = start(threads, two, FAKE2, num_sgd_iter=2, num_multi_gpu_tower_stacks=2)
    for i in range(5):
        t1.add(make_batch(i, rows=8))
    r1 = drain(t1.outqueue, 5)
    for i in range(5):  # one at a time: the order of several loader threads is not fixed
        t2.add(make_batch(i, rows=8))
        r2 = drain(t2.outqueue, 1)
        assert r2[0][2]["grad_norm"] == pytest.approx(r1[i][2]["grad_norm"], rel=1e-4)
    assert_same_weights(t1.get_weights(), t2.get_weights(), rtol=1e-4, atol=1e-5)


def test_each_tower_gets_its_replica_and_shard_and_the_masters_state(threads):
    seen = []

    def loss(module, batch, learner):
        seen.append((id(module), id(learner.module), batch[Col.OBS].shape[0], learner.extra_state.get("coef")))
        return mse_loss(module, batch, learner)

    learner = make_learner(loss_fn=loss)
    learner.extra_state["coef"] = 0.25
    t = start(threads, learner, FAKE2)
    t.add(make_batch(0, rows=10))
    drain(t.outqueue, 1)
    (m0, v0, n0, c0), (m1, v1, n1, c1) = seen
    assert m0 == v0 == id(learner.module) and m1 == v1 != m0
    assert n0 == n1 == 5 and c0 == c1 == 0.25


def test_stacks_go_idle_ready_idle_with_several_loaders(threads):
    gate = threading.Event()

    def gated_loss(module, batch, learner):
        gate.wait(10)
        return mse_loss(module, batch, learner)

    learner = make_learner(loss_fn=gated_loss)
    t = start(threads, learner, FAKE2, num_multi_gpu_tower_stacks=3, num_data_load_threads=2, num_sgd_iter=2)
    for i in range(6):
        assert t.add(make_batch(i, rows=8))
    # The learner holds one stack (blocked in its loss); the loaders fill the other two and stop there.
    deadline = time.monotonic() + 5
    while t.ready_stacks.qsize() < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert t.ready_stacks.qsize() == 2 and t.idle_stacks.qsize() == 0
    assert t.inqueue.qsize() == 3  # 6 - 1 learning - 2 preloaded
    assert all(len(s) == 2 for stack in list(t.ready_stacks.queue) for s in stack.shards.values())
    gate.set()
    out = drain(t.outqueue, 6)
    assert sorted(e for e, _, _ in out) == [8] * 6
    time.sleep(0.1)
    # At rest each loader holds an empty stack while it waits for the next batch; the third is idle.
    assert t.idle_stacks.qsize() == 1 and t.ready_stacks.qsize() == 0 and t.inqueue.qsize() == 0
    assert learner.num_updates == t.num_updates == 12
    s = t.stats()
    assert s["timers/learner_load_ms"] > 0 and s["timers/learner_load_wait_ms"] >= 0 and s["num_updates"] == 12.0
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


def test_batch_that_does_not_divide_over_devices_is_a_config_error_naming_the_sizes(threads):
    t = MultiDeviceLearnerThread(make_learner(), ["cpu"] * 3)
    threads.append(t)
    with pytest.raises(ConfigError, match=r"10 rows.*3 devices.*multiple of 3"):
        t.add(make_batch(0, rows=10))
    u = MultiDeviceLearnerThread(make_learner(), FAKE2, rows_per_unit=4)
    threads.append(u)
    with pytest.raises(ConfigError, match=r"12 rows.*2 devices.*rows_per_unit=4.*multiple of 8"):
        u.add(make_batch(0, rows=12))
    assert u.add(make_batch(0, rows=16))


def test_an_uneven_batch_put_on_the_queue_directly_surfaces_from_the_loader(threads):
    t = start(threads, make_learner(), FAKE2)
    t.inqueue.put(make_batch(0, rows=7))
    deadline = time.monotonic() + 5
    while t.loaders[0].is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(LearnerThreadError, match=r"loader.*7 rows") as e:
        t.check()
    assert isinstance(e.value.__cause__, ConfigError)


def test_split_fn_decides_the_shards(threads):
    calls = []

    def halves_by_parity(batch: Batch, n: int):
        calls.append(n)
        idx = np.arange(len(batch))
        return [batch.take(idx[idx % n == i]) for i in range(n)]

    one, two = make_learner(1), make_learner(1)
    t1 = start(threads, one, ["cpu"])
    t2 = start(threads, two, FAKE2, split_fn=halves_by_parity)
    t1.add(make_batch(4, rows=12))
    t2.add(make_batch(4, rows=12))
    drain(t1.outqueue, 1), drain(t2.outqueue, 1)
    assert calls == [2]
    assert_same_weights(t1.get_weights(), t2.get_weights())


def test_multi_agent_batches_match_single_device_per_policy(threads):
    multi = {"a": make_learner(0), "b": make_learner(1)}
    single = {"a": make_learner(0), "b": make_learner(1)}
    tm = start(threads, multi, FAKE2, num_sgd_iter=2)
    ts = start(threads, single, ["cpu"], num_sgd_iter=2)
    batch = {"a": make_batch(0, rows=8), "b": make_batch(1, rows=4)}
    tm.add(batch)
    ts.add(batch)
    outs = [q.get(timeout=10.0) for q in (tm.outqueue, tm.outqueue, ts.outqueue, ts.outqueue)]
    ma, mb, sa, sb = outs  # one result per policy, in the batch's order
    assert [(r.policy_id, r.env_steps, r.agent_steps) for r in outs] == [("a", 8, 8), ("b", 4, 4)] * 2
    assert set(mb.stats) == {"loss"} and mb.stats["loss"] == pytest.approx(sb.stats["loss"], rel=1e-5)
    assert ma.stats["loss"] == pytest.approx(sa.stats["loss"], rel=1e-5)
    for pid in ("a", "b"):
        assert_same_weights(tm.get_weights(pid), ts.get_weights(pid))
    with pytest.raises(ConfigError, match=r"policy 'b' has 3 rows"):
        tm.add({"a": make_batch(0, rows=8), "b": make_batch(1, rows=3)})


def test_get_weights_while_training_never_sees_a_half_applied_step(threads):
    learner = make_learner()
    t = start(threads, learner, FAKE2, num_sgd_iter=40, num_multi_gpu_tower_stacks=2)
    for i in range(4):
        t.add(make_batch(i, rows=8))
    snapshots = []
    while t.num_updates < 160:
        with t.hold():  # the lock every step holds: between two steps, never inside one
            snapshots.append((learner.num_updates, t.get_weights()))
    drain(t.outqueue, 4)
    assert len({n for n, _ in snapshots}) > 5  # the reads interleaved with many updates
    # A snapshot taken after k updates equals a plain learner's weights after k steps on the same data
    # (the first 40 steps are all on batch 0: one loader keeps the queue's order).
    ref, done, checked = make_learner(), 0, 0
    for n, w in sorted(((n, w) for n, w in snapshots if n <= 40), key=lambda s: s[0]):
        while done < n:
            ref.update_minibatch(make_batch(0, rows=8).to_torch())
            done += 1
        assert_same_weights(w, ref.get_weights())
        checked += 1
    assert checked >= 1


def test_queue_timeout_and_loss_errors_surface(threads):
    t = start(threads, make_learner(), FAKE2, learner_queue_timeout=0.3)
    t.loaders[0].join(3.0)
    with pytest.raises(LearnerThreadError, match="stayed empty") as e:
        t.check()
    assert isinstance(e.value.__cause__, LearnerQueueTimeout)

    def broken(module, batch, learner):
        raise FloatingPointError("nan in the loss on purpose")

    u = start(threads, make_learner(loss_fn=broken), FAKE2)
    u.add(make_batch(0, rows=4))
    u.join(3.0)
    with pytest.raises(LearnerThreadError, match="nan in the loss on purpose") as e:
        u.check()
    assert "broken" in str(e.value)


def test_idle_learner_and_stop(threads):
    t = MultiDeviceLearnerThread(make_learner(), FAKE2, num_data_load_threads=2)
    t.start()
    time.sleep(0.3)
    assert t.stats()["learner_idle_fraction"] > 0.9
    t0 = time.perf_counter()
    t.stop()
    assert time.perf_counter() - t0 < 0.5
    assert not t.is_alive() and not any(x.is_alive() for x in t.loaders)
    t.check()


def test_master_must_be_on_the_first_device():
    with pytest.raises(ConfigError, match="devices\\[0\\]"):
        MultiDeviceLearnerThread(make_learner(), ["cuda:0", "cpu"])
    with pytest.raises(ConfigError, match="num_multi_gpu_tower_stacks"):
        MultiDeviceLearnerThread(make_learner(), FAKE2, num_multi_gpu_tower_stacks=0)


def test_shard_weights_are_shares_of_the_valid_rows():
    from shoal.learn.multi_device import shard_weights

    v = np.array([1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0], dtype=bool)
    shards = [Batch({Col.VALID: v[:4]}), Batch({Col.VALID: v[4:8]}), Batch({Col.VALID: v[8:]})]
    assert shard_weights(shards) == pytest.approx([1 / 7, 4 / 7, 2 / 7])
    assert shard_weights([Batch({Col.OBS: np.zeros((n, 2))}) for n in (3, 1)]) == [0.75, 0.25]  # no mask: rows
    assert shard_weights([Batch({Col.VALID: np.zeros(2, bool)})] * 2) == [0.5, 0.5]  # nothing valid: equal
