"""Batch: construction, concat, slice, take, minibatches, to_torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shoal.batch import Batch, Col


def make(n=10, offset=0):
    return Batch(
        {
            Col.OBS: np.arange(offset, offset + n, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32),
            Col.ACTIONS: np.arange(offset, offset + n, dtype=np.int64),
            Col.TERMINATEDS: (np.arange(offset, offset + n) % 3 == 0),
        }
    )


def test_construction_and_mapping():
    b = make(10)
    assert len(b) == 10
    assert set(b.keys()) == {Col.OBS, Col.ACTIONS, Col.TERMINATEDS}
    assert Col.OBS in b and Col.REWARDS not in b
    assert b[Col.OBS].shape == (10, 3)
    assert len(Batch()) == 0
    # lists become arrays
    assert isinstance(Batch({"x": [1, 2, 3]})["x"], np.ndarray)
    assert "len=10" in repr(b)


def test_construction_length_mismatch():
    with pytest.raises(ValueError, match="'b' has 2 rows, expected 3"):
        Batch({"a": np.zeros(3), "b": np.zeros(2)})


def test_setitem_length_mismatch():
    b = make(4)
    b[Col.REWARDS] = np.ones(4)
    assert np.array_equal(b[Col.REWARDS], np.ones(4))
    with pytest.raises(ValueError, match="rows"):
        b[Col.VF_PREDS] = np.ones(5)
    assert Col.VF_PREDS not in b


def test_concat():
    a, b = make(3), make(4, offset=3)
    c = Batch.concat([a, Batch(), b])  # empty batches are skipped
    assert len(c) == 7
    np.testing.assert_array_equal(c[Col.ACTIONS], np.arange(7))
    np.testing.assert_array_equal(c[Col.OBS][:, 0], np.arange(7, dtype=np.float32))
    assert c[Col.OBS].shape == (7, 3)
    assert len(Batch.concat([])) == 0
    assert len(Batch.concat([Batch(), Batch()])) == 0


def test_concat_mismatched_columns():
    a = make(3)
    b = Batch({Col.OBS: np.zeros((2, 3)), Col.ACTIONS: np.zeros(2)})
    with pytest.raises(ValueError, match="cannot concat"):
        Batch.concat([a, b])


def test_slice_and_take():
    b = make(10)
    s = b.slice(2, 5)
    assert len(s) == 3
    np.testing.assert_array_equal(s[Col.ACTIONS], [2, 3, 4])
    np.testing.assert_array_equal(s[Col.TERMINATEDS], [False, True, False])
    t = b.take(np.array([9, 0, 4, 4]))
    np.testing.assert_array_equal(t[Col.ACTIONS], [9, 0, 4, 4])
    np.testing.assert_array_equal(t[Col.OBS][:, 2], [9, 0, 4, 4])
    assert set(t.keys()) == set(b.keys())


def test_minibatches_in_order():
    b = make(10)
    mbs = list(b.minibatches(4))
    assert [len(m) for m in mbs] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate([m[Col.ACTIONS] for m in mbs]), np.arange(10))
    assert [len(m) for m in b.minibatches(4, drop_last=True)] == [4, 4]
    assert [len(m) for m in b.minibatches(5, drop_last=True)] == [5, 5]
    assert [len(m) for m in b.minibatches(20)] == [10]
    assert list(b.minibatches(20, drop_last=True)) == []


def test_minibatches_shuffled_cover_every_row_once():
    b = make(23)
    mbs = list(b.minibatches(5, rng=np.random.default_rng(0)))
    assert [len(m) for m in mbs] == [5, 5, 5, 5, 3]
    rows = np.concatenate([m[Col.ACTIONS] for m in mbs])
    assert sorted(rows.tolist()) == list(range(23))
    assert not np.array_equal(rows, np.arange(23))  # actually shuffled
    # columns stay aligned row by row
    for m in mbs:
        np.testing.assert_array_equal(m[Col.OBS][:, 1], m[Col.ACTIONS].astype(np.float32))
        np.testing.assert_array_equal(m[Col.TERMINATEDS], m[Col.ACTIONS] % 3 == 0)
    # same seed, same order
    again = np.concatenate([m[Col.ACTIONS] for m in b.minibatches(5, rng=np.random.default_rng(0))])
    np.testing.assert_array_equal(rows, again)
    dropped = list(b.minibatches(5, rng=np.random.default_rng(0), drop_last=True))
    assert [len(m) for m in dropped] == [5, 5, 5, 5]
    assert len(set(np.concatenate([m[Col.ACTIONS] for m in dropped]).tolist())) == 20


def test_minibatches_bad_size():
    with pytest.raises(ValueError, match="positive"):
        list(make(3).minibatches(0))


def test_to_torch():
    b = make(5)
    b[Col.REWARDS] = np.array([0.5, 1, 2, 3, 4], dtype=np.float64)
    t = b.to_torch()
    assert t[Col.OBS].dtype == torch.float32
    assert t[Col.ACTIONS].dtype == torch.int64
    assert t[Col.TERMINATEDS].dtype == torch.bool
    assert t[Col.REWARDS].dtype == torch.float64
    assert t[Col.OBS].shape == (5, 3)
    assert torch.equal(t[Col.ACTIONS], torch.arange(5))
    assert torch.equal(t[Col.TERMINATEDS], torch.tensor([True, False, False, True, False]))
    np.testing.assert_array_equal(t[Col.REWARDS].numpy(), b[Col.REWARDS])
    # non-contiguous columns are made contiguous
    nc = Batch({"x": np.arange(12).reshape(3, 4)[:, ::2]})
    tx = nc.to_torch()["x"]
    assert tx.is_contiguous()
    assert torch.equal(tx, torch.tensor([[0, 2], [4, 6], [8, 10]]))
