"""Replay: sum tree, uniform and prioritized ring buffers, replay shard, checkpoint round trip."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shoal import checkpoint as ckpt
from shoal.batch import Batch, Col
from shoal.errors import ConfigError
from shoal.replay import PrioritizedReplayBuffer, ReplayBuffer, ReplayShard, SumTree, warmup

# Chi-square critical values at p = 0.001 (from tables), by degrees of freedom.
CHI2_CRIT_001 = {3: 16.266, 7: 24.322}


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels():
    warmup()  # compile or load the numba kernels once, not inside the first test's timing


def rows(values, obs_dim: int = 2) -> Batch:
    """Rows whose every column encodes ``values``, to check which row sits in which slot."""
    v = np.asarray(values, dtype=np.float32)
    return Batch(
        {
            Col.OBS: v[:, None] * np.ones((1, obs_dim), np.float32),
            Col.ACTIONS: v.astype(np.int64),
            Col.REWARDS: v,
            Col.TERMINATEDS: v.astype(np.int64) % 2 == 0,
        }
    )


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


# ---- sum tree ------------------------------------------------------------------------------
def test_sum_tree_find_against_hand_computed_prefix_sums():
    tree = SumTree(4)
    tree.set([0, 1, 2, 3], [1.0, 2.0, 3.0, 4.0])  # cumulative sums 1, 3, 6, 10
    assert tree.total == 10.0 and tree.min == 1.0
    targets = [0.0, 0.5, 0.999, 1.0, 2.9, 3.0, 5.99, 6.0, 9.99, 10.0, 12.0]
    assert tree.find(targets).tolist() == [0, 0, 0, 1, 1, 2, 2, 3, 3, 3, 3]


def test_sum_tree_never_returns_an_empty_leaf():
    tree = SumTree(5)  # base 8: leaves 5..7 unused
    tree.set([0, 1, 2], [1.0, 0.0, 2.0])
    assert tree.find([0.99, 1.0, 1.5, 2.999, 3.0, 100.0]).tolist() == [0, 2, 2, 2, 2, 2]
    assert tree.min == 0.0


def test_sum_tree_repeated_indices_last_wins_and_no_drift():
    rng = np.random.default_rng(0)
    cap = 1000
    tree, ref = SumTree(cap), np.zeros(cap)
    for _ in range(200):
        idx = rng.integers(0, cap, 300)  # many repeats within each batch
        val = rng.random(300) * 10
        tree.set(idx, val)
        for i, v in zip(idx, val):  # reference: sequential assignment
            ref[i] = v
    np.testing.assert_array_equal(tree.get(np.arange(cap)), ref)
    assert tree.total == pytest.approx(ref.sum(), rel=1e-12)
    assert tree.min == ref.min()
    tree.set([7, 7, 7], [1.0, 2.0, 0.5])
    assert tree.get([7])[0] == 0.5


def test_sum_tree_capacity_one_and_bad_input():
    tree = SumTree(1)
    tree.set([0], [2.5])
    assert tree.total == 2.5 and tree.find([0.0, 2.4]).tolist() == [0, 0]
    with pytest.raises(IndexError):
        tree.set([1], [1.0])
    with pytest.raises(ValueError):
        tree.set([0], [-1.0])
    with pytest.raises(ValueError):
        SumTree(0)
    with pytest.raises(ValueError, match="total is 0"):
        SumTree(3).find([0.0])


def test_sum_tree_load_rebuilds_inner_nodes():
    tree = SumTree(6)
    tree.set([5], [9.0])
    tree.load([1.0, 2.0, 3.0])
    assert tree.total == 6.0 and tree.min == 1.0
    assert tree.get([5])[0] == 0.0
    assert tree.find([3.5]).tolist() == [2]


# ---- uniform buffer ------------------------------------------------------------------------
def test_ring_wraps_and_overwrites_the_oldest():
    buf = ReplayBuffer(5, seed=0)
    assert buf.add(rows([0, 1, 2])).tolist() == [0, 1, 2]
    slots = buf.add(rows([3, 4, 5, 6]))
    assert slots.dtype == np.int64 and slots.tolist() == [3, 4, 0, 1]
    assert len(buf) == 5 and buf.capacity == 5 and buf.added == 7
    b = buf.sample(200)
    assert set(b[Col.INDICES].tolist()) == {0, 1, 2, 3, 4}
    slot_value = {0: 5, 1: 6, 2: 2, 3: 3, 4: 4}
    expected = np.array([slot_value[i] for i in b[Col.INDICES]], dtype=np.float32)
    np.testing.assert_array_equal(b[Col.REWARDS], expected)
    np.testing.assert_array_equal(b[Col.OBS][:, 1], expected)
    np.testing.assert_array_equal(b[Col.ACTIONS], expected.astype(np.int64))
    assert b[Col.OBS].dtype == np.float32 and b[Col.TERMINATEDS].dtype == np.bool_


def test_batch_longer_than_capacity_keeps_its_last_rows():
    buf = ReplayBuffer(4)
    buf.add(rows([100]))
    slots = buf.add(rows(np.arange(10)))
    assert slots.tolist() == [1, 2, 3, 0]
    assert len(buf) == 4 and buf.added == 11
    b = buf.sample(50)
    assert sorted(set(b[Col.REWARDS].tolist())) == [6, 7, 8, 9]


def test_uniform_sampling_frequencies():
    buf = ReplayBuffer(8, seed=1)
    buf.add(rows(np.arange(8)))
    counts = np.bincount(buf.sample(40_000)[Col.INDICES], minlength=8)
    assert chi_square(counts, np.full(8, 1 / 8)) < CHI2_CRIT_001[7]


def test_uniform_buffer_bad_input():
    for bad in (0, -3, 2.5, True, "10"):
        with pytest.raises(ConfigError, match="capacity"):
            ReplayBuffer(bad)
    buf = ReplayBuffer(10)
    with pytest.raises(ValueError, match="empty"):
        buf.sample(4)
    buf.add(rows([1, 2]))
    with pytest.raises(ValueError, match="columns"):
        buf.add(Batch({Col.OBS: np.zeros((2, 2), np.float32)}))
    with pytest.raises(ValueError, match="shape"):
        buf.add(rows([1, 2], obs_dim=3))
    bad_dtype = rows([1, 2])
    bad_dtype[Col.ACTIONS] = np.array([0.5, 1.5])
    with pytest.raises(ValueError, match="dtype"):
        buf.add(bad_dtype)
    with pytest.raises(TypeError):
        buf.add({Col.OBS: np.zeros((2, 2))})
    with pytest.raises(ValueError):
        buf.sample(0)
    assert len(buf) == 2  # failed adds changed nothing
    assert buf.add(Batch()).tolist() == [] and len(buf) == 2  # an empty batch is a no-op


def test_sampled_outputs_are_not_stored_back():
    buf = ReplayBuffer(10, seed=0)
    buf.add(rows([1, 2, 3]))
    again = buf.sample(4)
    buf.add(again)  # Col.INDICES is dropped, so the columns still match
    assert len(buf) == 7 and Col.INDICES not in buf.columns


# ---- prioritized buffer --------------------------------------------------------------------
def test_weights_against_hand_computed_values():
    # alpha 0.5, eps 1: stored (p + 1) ** 0.5 = 1, 2, 3, 4 -> P = .1 .2 .3 .4, N = 4.
    # beta 0.5: w_i = (N P_i) ** -0.5 / (N P_min) ** -0.5 = (P_i / 0.1) ** -0.5.
    buf = PrioritizedReplayBuffer(4, alpha=0.5, beta=0.5, eps=1.0, seed=0)
    buf.add(rows([0, 1, 2, 3]), priorities=np.array([0.0, 3.0, 8.0, 15.0]))
    np.testing.assert_allclose(buf.priorities(), [1, 2, 3, 4])
    b = buf.sample(400)
    expected = np.array([1.0, 2**-0.5, 3**-0.5, 0.5])
    assert b[Col.WEIGHTS].dtype == np.float32
    np.testing.assert_allclose(b[Col.WEIGHTS], expected[b[Col.INDICES]], rtol=1e-6)
    np.testing.assert_array_equal(b[Col.REWARDS], b[Col.INDICES].astype(np.float32))
    # beta 1 given to sample: w = 0.1 / P_i = 1, 1/2, 1/3, 1/4; beta 0: all ones
    b = buf.sample(400, beta=1.0)
    np.testing.assert_allclose(b[Col.WEIGHTS], (1.0 / np.arange(1, 5))[b[Col.INDICES]], rtol=1e-6)
    np.testing.assert_array_equal(buf.sample(50, beta=0.0)[Col.WEIGHTS], np.ones(50, np.float32))


def test_sampling_frequencies_match_priorities():
    raw = np.array([0.1, 0.5, 1.0, 2.0, 0.0, 4.0, 0.3, 8.0])
    buf = PrioritizedReplayBuffer(8, alpha=0.6, eps=1e-6, seed=3)
    buf.add(rows(np.arange(8)), priorities=raw)
    probs = (raw + 1e-6) ** 0.6
    probs /= probs.sum()
    counts = np.zeros(8)
    for _ in range(100):
        counts += np.bincount(buf.sample(500)[Col.INDICES], minlength=8)
    assert chi_square(counts, probs) < CHI2_CRIT_001[7]
    np.testing.assert_allclose(counts / counts.sum(), probs, atol=0.01)


def test_sampling_is_stratified_one_draw_per_segment():
    rng = np.random.default_rng(0)
    raw = rng.random(100) * 3
    buf = PrioritizedReplayBuffer(100, alpha=0.7, seed=5)
    buf.add(rows(np.arange(100)), priorities=raw)
    stored = buf.priorities()
    upper = np.cumsum(stored)
    lower = upper - stored
    n = 32
    seg = upper[-1] / n
    for _ in range(20):
        idx = buf.sample(n)[Col.INDICES]
        k = np.arange(n)
        # leaf idx[k]'s mass interval meets segment k of the total
        assert np.all(lower[idx] <= (k + 1) * seg + 1e-9) and np.all(upper[idx] >= k * seg - 1e-9)
        assert np.all(np.diff(idx) >= 0)
    # equal priorities and n == size: every row exactly once
    flat = PrioritizedReplayBuffer(16, seed=0)
    flat.add(rows(np.arange(16)))
    assert flat.sample(16)[Col.INDICES].tolist() == list(range(16))


def test_update_priorities_repeated_indices_last_wins():
    buf = PrioritizedReplayBuffer(4, alpha=1.0, eps=0.5, seed=0)
    buf.add(rows([0, 1, 2, 3]), priorities=np.array([1.5, 1.5, 1.5, 1.5]))
    buf.update_priorities(np.array([1, 2, 1, 1]), np.array([9.5, 3.5, 0.0, 5.5]))
    np.testing.assert_allclose(buf.priorities(), [2.0, 6.0, 4.0, 2.0])
    assert buf._tree.total == pytest.approx(14.0) and buf._tree.min == pytest.approx(2.0)
    assert buf.max_priority == 9.5  # the max seen, even though it was overwritten


def test_default_priority_is_the_max_seen():
    buf = PrioritizedReplayBuffer(10, alpha=0.5, eps=1e-6)
    buf.add(rows([0, 1]))
    np.testing.assert_allclose(buf.priorities(), [(1 + 1e-6) ** 0.5] * 2)
    buf.update_priorities(np.array([0]), np.array([16.0]))
    buf.add(rows([2]))
    np.testing.assert_allclose(buf.priorities(), [(16 + 1e-6) ** 0.5, (1 + 1e-6) ** 0.5, (16 + 1e-6) ** 0.5])
    buf.update_priorities(np.array([0, 2]), np.array([0.0, 0.0]))
    buf.add(rows([3]))  # the max seen does not go down
    assert buf.priorities()[3] == pytest.approx(4.0)


def test_prioritized_wrap_around_keeps_priorities_with_their_rows():
    buf = PrioritizedReplayBuffer(5, alpha=1.0, eps=1e-6, seed=0)
    buf.add(rows([0, 1, 2]), priorities=np.array([10.0, 10.0, 10.0]))
    slots = buf.add(rows([3, 4, 5, 6]), priorities=np.array([1.0, 2.0, 3.0, 4.0]))
    assert slots.tolist() == [3, 4, 0, 1]
    np.testing.assert_allclose(buf.priorities(), np.array([3.0, 4.0, 10.0, 1.0, 2.0]) + 1e-6)
    b = buf.sample(1000)
    slot_value = np.array([5, 6, 2, 3, 4], dtype=np.float32)
    np.testing.assert_array_equal(b[Col.REWARDS], slot_value[b[Col.INDICES]])
    freq = np.bincount(b[Col.INDICES], minlength=5) / 1000
    np.testing.assert_allclose(freq, np.array([3, 4, 10, 1, 2]) / 20, atol=0.01)  # stratified: tight
    # a longer-than-capacity batch keeps the priorities of the rows it keeps
    buf.add(rows(np.arange(7)), priorities=np.arange(7, dtype=np.float64))
    np.testing.assert_allclose(buf.priorities(), np.array([5, 6, 2, 3, 4]) + 1e-6)


def test_row_ids_name_the_rows_in_the_sampled_slots_across_wraps():
    buf = ReplayBuffer(4, seed=0)
    buf.add(rows([0, 1, 2]))
    buf.add(rows([3, 4, 5]))  # ids 3, 4, 5 into slots 3, 0, 1
    b = buf.sample(200)
    assert set(b[Col.INDICES].tolist()) == {0, 1, 2, 3}
    # rows([...]) stores each row's value in REWARDS, and the values here are the ids (add order)
    np.testing.assert_array_equal(b[Col.ROW_IDS], np.array([4, 5, 2, 3])[b[Col.INDICES]])
    np.testing.assert_array_equal(b[Col.ROW_IDS], b[Col.REWARDS].astype(np.int64))
    buf.add(rows(np.arange(6, 16)))  # longer than the ring: keeps ids 12..15 in slots 2, 3, 0, 1
    np.testing.assert_array_equal(buf.row_ids(np.arange(4)), [14, 15, 12, 13])
    again = buf.sample(3)
    buf.add(again)  # sampled outputs are not stored back
    assert Col.ROW_IDS not in buf.columns


def test_priorities_of_overwritten_slots_are_dropped():
    """The learner returns priorities for slots 0-3 after the ring wrapped over slots 0 and 1."""
    buf = PrioritizedReplayBuffer(4, alpha=1.0, eps=1e-6, seed=0)
    buf.add(rows([0, 1, 2, 3]), priorities=np.array([1.0, 1.0, 1.0, 1.0]))
    sampled_slots, sampled_ids = np.array([0, 1, 2, 3]), buf.row_ids(np.arange(4))
    assert sampled_ids.tolist() == [0, 1, 2, 3]
    buf.add(rows([4, 5]), priorities=np.array([2.0, 3.0]))  # slots 0 and 1 now hold rows 4 and 5
    n = buf.update_priorities(sampled_slots, np.array([7.0, 7.0, 5.0, 6.0]), sampled_ids)
    assert n == 2
    # rows 4 and 5 keep the priorities they came with; rows 2 and 3 get their new ones
    np.testing.assert_allclose(buf.priorities(), np.array([2.0, 3.0, 5.0, 6.0]) + 1e-6)
    assert buf.max_priority == 6.0  # the dropped 7s never counted
    # without row ids (the old call) the priorities land on whatever rows hold the slots now
    assert buf.update_priorities(sampled_slots, np.array([7.0, 7.0, 5.0, 6.0])) == 4
    np.testing.assert_allclose(buf.priorities(), np.array([7.0, 7.0, 5.0, 6.0]) + 1e-6)
    # a slot outside the buffer is still an error, not a silently dropped entry
    small = PrioritizedReplayBuffer(4, seed=0)
    small.add(rows([0, 1]))
    with pytest.raises(ValueError, match="slot 3"):
        small.update_priorities(np.array([0, 3]), np.array([1.0, 1.0]), np.array([0, 3]))
    with pytest.raises(ValueError, match="row_ids"):
        small.update_priorities(np.array([0, 1]), np.array([1.0, 1.0]), np.array([0]))


def test_shard_drops_and_counts_stale_priorities():
    shard = ReplayShard(4, prioritized=True, alpha=1.0, eps=1e-6, seed=0)
    shard.add(rows([0, 1, 2, 3]), priorities=np.ones(4))
    b = shard.sample(8)
    shard.add(rows([4, 5]), priorities=np.full(2, 0.5))  # overwrites slots 0 and 1
    fresh = int(np.isin(b[Col.INDICES], [2, 3]).sum())
    assert shard.update_priorities(b[Col.INDICES], np.full(8, 9.0), b[Col.ROW_IDS]) == fresh
    stats = shard.stats()
    assert (stats["updated"], stats["stale"]) == (fresh, 8 - fresh)
    np.testing.assert_allclose(shard.buffer.priorities()[:2], 0.5 + 1e-6)


def test_prioritized_bad_input_is_a_clear_error_and_changes_nothing():
    for kwargs in ({"alpha": -0.1}, {"beta": -1.0}, {"eps": 0.0}, {"eps": float("nan")}, {"capacity": 0}):
        args = {"capacity": 10, **kwargs}
        with pytest.raises(ConfigError, match=next(iter(kwargs))):
            PrioritizedReplayBuffer(**args)
    buf = PrioritizedReplayBuffer(10, seed=0)
    with pytest.raises(ValueError, match="empty"):
        buf.sample(2)
    assert buf.add(Batch(), priorities=np.zeros(0)).size == 0
    with pytest.raises(ValueError, match="priorities must be finite and >= 0"):
        buf.add(rows([0, 1]), priorities=np.array([1.0, -0.5]))
    with pytest.raises(ValueError, match="shape"):
        buf.add(rows([0, 1]), priorities=np.array([1.0]))
    assert len(buf) == 0
    buf.add(rows([0, 1, 2]), priorities=np.array([1.0, 2.0, 3.0]))
    before = buf.priorities().copy()
    with pytest.raises(ValueError, match="priority -1.0"):
        buf.update_priorities(np.array([0, 1]), np.array([5.0, -1.0]))
    with pytest.raises(ValueError, match="priority nan"):
        buf.update_priorities(np.array([0]), np.array([np.nan]))
    with pytest.raises(ValueError, match="slot 3"):
        buf.update_priorities(np.array([0, 3]), np.array([5.0, 1.0]))
    with pytest.raises(ValueError, match="integers"):
        buf.update_priorities(np.array([0.0]), np.array([1.0]))
    with pytest.raises(ValueError, match="equally long"):
        buf.update_priorities(np.array([0, 1]), np.array([1.0]))
    with pytest.raises(ConfigError, match="beta"):
        buf.sample(2, beta=-0.5)
    np.testing.assert_array_equal(buf.priorities(), before)


def test_large_buffer_tree_stays_exact():
    cap = 100_000
    rng = np.random.default_rng(0)
    buf = PrioritizedReplayBuffer(cap, alpha=0.6, seed=0)
    buf.add(Batch({Col.REWARDS: np.zeros(cap + 123, np.float32)}), priorities=rng.random(cap + 123))
    for _ in range(50):
        b = buf.sample(512)
        buf.update_priorities(b[Col.INDICES], rng.random(512) * 5)
    stored = buf.priorities()
    assert buf._tree.total == pytest.approx(stored.sum(), rel=1e-12)
    assert buf._tree.min == stored.min()
    w = buf.sample(512)[Col.WEIGHTS]
    assert w.max() <= 1.0 and w.min() > 0


# ---- shard ---------------------------------------------------------------------------------
def test_shard_counts_samples_and_beta():
    shard = ReplayShard(100, prioritized=True, alpha=1.0, beta=0.4, eps=1e-6, seed=0)
    assert shard.ping() is True
    assert shard.sample(8) is None
    assert shard.add(rows([0, 1, 2, 3]), priorities=np.array([1.0, 1.0, 1.0, 4.0])) == 4
    b = shard.sample(8)
    assert len(b) == 8 and Col.WEIGHTS in b and Col.INDICES in b
    shard.update_priorities(b[Col.INDICES], np.ones(8))
    stats = shard.stats()
    assert {k: stats[k] for k in ("size", "added", "sampled", "updated")} == {
        "size": 4,
        "added": 4,
        "sampled": 8,
        "updated": 8,
    }
    shard.update_priorities(np.array([3]), np.array([3.0]))  # stored: 1, 1, 1, 3 -> p_min / p_3 = 1/3
    shard.set_beta(1.0)
    b = shard.sample(64)
    np.testing.assert_allclose(b[Col.WEIGHTS][b[Col.INDICES] == 3], 1 / 3, rtol=1e-5)
    assert shard.stats()["beta"] == 1.0
    with pytest.raises(ConfigError):
        shard.set_beta(-1)


def test_uniform_shard_gives_unit_weights_and_ignores_priorities():
    shard = ReplayShard(10, prioritized=False, seed=0)
    shard.add(rows([0, 1, 2]), priorities=np.array([5.0, 5.0, 5.0]))
    b = shard.sample(6)
    np.testing.assert_array_equal(b[Col.WEIGHTS], np.ones(6, np.float32))
    shard.update_priorities(b[Col.INDICES], np.ones(6))
    assert shard.stats()["updated"] == 6 and len(shard) == 3


# ---- state and checkpoints -----------------------------------------------------------------
def assert_no_numpy(obj, path="state"):
    assert not isinstance(obj, np.ndarray), f"{path} is a numpy array"
    if isinstance(obj, dict):
        for k, v in obj.items():
            assert_no_numpy(v, f"{path}.{k}")


def test_prioritized_state_round_trip_through_a_checkpoint(tmp_path):
    shard = ReplayShard(6, prioritized=True, alpha=0.6, beta=0.4, seed=7)
    shard.add(rows([0, 1, 2, 3]), priorities=np.array([0.1, 2.0, 0.5, 3.0]))
    shard.add(rows([4, 5, 6, 7]), priorities=np.array([1.0, 0.2, 9.0, 0.4]))  # wraps
    b = shard.sample(4)
    shard.update_priorities(b[Col.INDICES], np.array([0.3, 0.3, 5.0, 0.7]))
    state = shard.get_state()
    assert_no_numpy(state)
    path = ckpt.save_checkpoint(tmp_path / "ckpt", {"replay": [state]}, {"algo": "test"})
    loaded, _ = ckpt.load_checkpoint(path)  # torch.load(weights_only=True) inside

    restored = ReplayShard(6, prioritized=True, alpha=0.6, beta=0.4, seed=123)
    restored.set_state(loaded["replay"][0])
    assert restored.stats() == shard.stats()
    np.testing.assert_array_equal(restored.buffer.priorities(), shard.buffer.priorities())
    for col, (shape, dtype) in shard.buffer.columns.items():
        assert restored.buffer.columns[col] == (shape, dtype)
    a, c = shard.sample(16), restored.sample(16)  # same rng state, same tree -> same batch
    for col in a.keys():
        np.testing.assert_array_equal(a[col], c[col])
    assert shard.add(rows([8]), priorities=None) == restored.add(rows([8]))
    np.testing.assert_array_equal(restored.buffer.priorities(), shard.buffer.priorities())


def test_uniform_state_round_trip_and_mismatch_errors(tmp_path):
    buf = ReplayBuffer(4, seed=1)
    buf.add(rows([0, 1, 2, 3, 4, 5]))
    path = ckpt.save_checkpoint(tmp_path / "u", {"replay": buf.get_state()}, {"algo": "test"})
    state, _ = ckpt.load_checkpoint(path)
    other = ReplayBuffer(4)
    other.set_state(state["replay"])
    assert len(other) == 4 and other.added == 6
    np.testing.assert_array_equal(other.sample(8)[Col.REWARDS], buf.sample(8)[Col.REWARDS])
    np.testing.assert_array_equal(other.add(rows([9])), buf.add(rows([9])))
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(5).set_state(state["replay"])
    with pytest.raises(ValueError, match="prioritized"):
        ReplayShard(4, prioritized=True).set_state({"prioritized": False, "counts": {}, "buffer": state["replay"]})
    with pytest.raises(ValueError, match="uniform"):
        PrioritizedReplayBuffer(4).set_state(state["replay"])
    empty = ReplayBuffer(3).get_state()
    restored = ReplayBuffer(3)
    restored.set_state(empty)
    assert len(restored) == 0


def test_restore_under_a_new_alpha_reexpresses_priorities():
    buf = PrioritizedReplayBuffer(4, alpha=0.5, eps=1e-6)
    buf.add(rows([0, 1]), priorities=np.array([3.0, 8.0]))
    other = PrioritizedReplayBuffer(4, alpha=1.0, eps=1e-6)
    other.set_state(buf.get_state())
    np.testing.assert_allclose(other.priorities(), [3.0 + 1e-6, 8.0 + 1e-6], rtol=1e-9)
    assert isinstance(buf.get_state()["priorities"], torch.Tensor)


def test_kernels_compile_without_a_writable_cache(monkeypatch):
    import numba

    from shoal.replay import sum_tree as st

    real_njit = numba.njit

    def njit_without_cache(*args, **kwargs):
        if kwargs.get("cache"):
            raise RuntimeError("cannot cache function: no locator available")
        return real_njit(*args, **kwargs)

    monkeypatch.setattr(numba, "njit", njit_without_cache)

    def double_all(x):
        return x * 2.0

    kernel = st._jit(double_all)
    np.testing.assert_array_equal(kernel(np.array([1.0, 2.0])), [2.0, 4.0])
    assert hasattr(kernel, "py_func")  # a numba dispatcher, compiled in memory


@pytest.mark.ray
def test_replay_shards_as_ray_actors(ray_cluster):
    from shoal import runtime

    def ctor(i: int):
        return (50,), {"prioritized": True, "alpha": 1.0, "beta": 1.0, "eps": 1e-6, "seed": i}

    group = runtime.make_actor_group(ReplayShard, 2, ctor, remote=True, num_cpus=0.25, name="replay shard")
    try:
        assert group.foreach("ping") == [True, True]
        assert group.call(1, "sample", 4) is None  # empty shard
        group.call(1, "add", rows([0, 1, 2, 3]), np.array([1.0, 1.0, 1.0, 3.0]))
        group.call(2, "add", rows([10, 11]))
        b = group.call(1, "sample", 64)
        assert set(b[Col.REWARDS].tolist()) <= {0, 1, 2, 3}
        np.testing.assert_allclose(b[Col.WEIGHTS], np.where(b[Col.INDICES] == 3, 1 / 3, 1.0), rtol=1e-5)
        group.call(1, "update_priorities", b[Col.INDICES], np.ones(64))
        stats = dict(zip((1, 2), group.foreach("stats")))
        assert (stats[1]["size"], stats[1]["sampled"], stats[1]["updated"]) == (4, 64, 64)
        assert stats[2]["size"] == 2
        state = group.call(1, "get_state")
        local = ReplayShard(50, prioritized=True, alpha=1.0, beta=1.0, eps=1e-6)
        local.set_state(state)
        np.testing.assert_allclose(local.buffer.priorities(), np.full(4, 1 + 1e-6))
    finally:
        group.stop()


def test_shard_is_safe_to_share_between_threads():
    import threading

    shard = ReplayShard(2000, prioritized=True, seed=0)
    shard.add(rows(np.arange(100)))
    errors = []

    def writer():
        try:
            for i in range(200):
                shard.add(rows(np.arange(10) + i), priorities=np.full(10, 0.5))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def learner():
        try:
            for _ in range(200):
                b = shard.sample(32)
                shard.update_priorities(b[Col.INDICES], np.full(32, 2.0))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer), threading.Thread(target=learner)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    stored = shard.buffer.priorities()
    assert len(shard) == 2000 and shard.stats()["added"] == 2100
    assert shard.buffer._tree.total == pytest.approx(stored.sum(), rel=1e-12)
    assert shard.buffer._tree.min == stored.min()
