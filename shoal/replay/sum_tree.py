"""Sum tree and min tree over a flat array, with batch kernels compiled by numba.

Layout: ``base`` is the smallest power of two >= capacity; node ``i`` (1-based, root 1) has
children ``2i`` and ``2i+1``; leaf ``j`` lives at ``base + j``. One array ``tree`` of shape
``(2 * base, 2)`` holds each node's sum in column 0 and its min in column 1, so a node's two
children (sums and mins) share one 64-byte cache line: with a million leaves the tree does
not fit in the core's cache, and cache misses are what an update or a search costs. Every update recomputes the
parents from their children instead of adding deltas, so repeated indices in one batch
give "the last one wins" and no rounding drift builds up over millions of updates. Unused
leaves hold 0 in the sum tree and +inf in the min tree.

All kernels take whole batches (vectors of indices, values or search targets); the Python
side makes one call per batch. They are compiled with ``cache=True`` so a process reuses an
earlier compilation from disk; where no cache directory is writable they compile in memory,
and without numba at all they run as (slow but correct) Python.
"""

from __future__ import annotations

import numpy as np

try:
    import numba
except ImportError:  # pragma: no cover - numba is a declared dependency
    numba = None


def _jit(fn):
    if numba is None:  # pragma: no cover
        return fn
    try:
        return numba.njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # no writable cache location: compile per process instead
        return numba.njit(nogil=True)(fn)


@_jit
def _set_leaves(tree, base, idx, values):
    """Write the leaves in order (the last of repeated indices wins), then fix the parents
    level by level. The touched nodes are kept sorted and unique, so each parent is
    recomputed once per level from its children (final by then), memory is walked in
    ascending order, and the loads for different nodes overlap."""
    n = idx.shape[0]
    for k in range(n):
        node = base + idx[k]
        tree[node, 0] = values[k]
        tree[node, 1] = values[k]
    nodes = np.sort(idx) + base
    m = n
    while m > 0 and nodes[0] > 1:
        j = 0
        prev = -1
        for k in range(m):
            node = nodes[k] // 2
            if node != prev:
                left = 2 * node
                tree[node, 0] = tree[left, 0] + tree[left + 1, 0]
                tree[node, 1] = min(tree[left, 1], tree[left + 1, 1])
                nodes[j] = node
                j += 1
                prev = node
        m = j


@_jit
def tree_set(tree, base, idx, values):
    """Set leaves ``idx[k] = values[k]`` in order (a repeated index keeps its last value)."""
    _set_leaves(tree, base, idx, values)


@_jit
def tree_rebuild(tree, base):
    """Recompute every inner node from the leaves (after a bulk load)."""
    for node in range(base - 1, 0, -1):
        tree[node, 0] = tree[2 * node, 0] + tree[2 * node + 1, 0]
        tree[node, 1] = min(tree[2 * node, 1], tree[2 * node + 1, 1])


@_jit
def tree_find(tree, base, targets):
    """Leaf index holding each target prefix sum: the first ``j`` with cumsum[j] > target.

    A target at or past the total (rounding) lands on the last leaf with positive mass;
    a leaf with zero mass is never returned while the total is positive. The descent runs
    one level at a time for all targets, so the loads of different targets overlap.
    """
    n = targets.shape[0]
    nodes = np.ones(n, dtype=np.int64)
    rest = targets.copy()
    level = 1
    while level < base:
        for k in range(n):
            left = 2 * nodes[k]
            mass = tree[left, 0]
            if rest[k] < mass or tree[left + 1, 0] <= 0.0:
                nodes[k] = left
            else:
                rest[k] -= mass
                nodes[k] = left + 1
        level *= 2
    return nodes - base


@_jit
def per_update(tree, base, size, idx, raw, alpha, eps, row_ids, pos, added, capacity):
    """Store ``(raw + eps) ** alpha`` at slots ``idx``; validate everything before writing.

    With ``row_ids`` non-empty, entry ``k`` is skipped when slot ``idx[k]`` no longer holds
    row ``row_ids[k]`` (see :func:`row_ids`): it was overwritten since it was sampled.
    Returns ``(bad, max_raw, written)``: ``bad`` is -1 when all is well, else the position of
    the first invalid entry (slot outside ``[0, size)``, or a priority negative or not
    finite), in which case nothing was written; ``max_raw`` is over the written entries.
    """
    n = idx.shape[0]
    for k in range(n):
        p = raw[k]
        if idx[k] < 0 or idx[k] >= size or not (p >= 0.0 and p < np.inf):
            return k, 0.0, 0
    check = row_ids.shape[0] > 0
    kept = np.empty(n, dtype=np.int64)
    values = np.empty(n, dtype=np.float64)
    max_raw = 0.0
    m = 0
    for k in range(n):
        if check and _row_id(idx[k], pos, added, capacity) != row_ids[k]:
            continue
        if raw[k] > max_raw:
            max_raw = raw[k]
        kept[m] = idx[k]
        values[m] = (raw[k] + eps) ** alpha
        m += 1
    _set_leaves(tree, base, kept[:m], values[:m])
    return -1, max_raw, m


@_jit
def _row_id(slot, pos, added, capacity):
    back = pos - 1 - slot  # how many writes ago the slot was written, in [-capacity, capacity)
    if back < 0:
        back += capacity
    return added - 1 - back


@_jit
def row_ids(slots, pos, added, capacity):
    """Add-order ids of the rows in ``slots`` of a ring of ``capacity`` that has taken ``added``
    rows and writes the next one at ``pos`` (the newest row, in slot ``pos - 1``, is ``added - 1``)."""
    out = np.empty(slots.shape[0], dtype=np.int64)
    for k in range(slots.shape[0]):
        out[k] = _row_id(slots[k], pos, added, capacity)
    return out


@_jit
def per_sample(tree, base, size, uniforms, beta):
    """Stratified prioritized sample and normalized importance weights.

    Sample ``k`` is drawn uniformly from segment ``k`` of ``n`` equal segments of the total
    mass (``uniforms[k]`` in [0, 1) places it inside the segment). Weights follow Schaul et
    al. (2016): ``w_i = (N P(i)) ** -beta / max_j (N P(j)) ** -beta``; the maximum comes
    from the smallest stored priority, so ``w_i = (p_i / p_min) ** -beta`` (<= 1).
    """
    n = uniforms.shape[0]
    segment = tree[1, 0] / n
    targets = np.empty(n, dtype=np.float64)
    for k in range(n):
        targets[k] = (k + uniforms[k]) * segment
    idx = tree_find(tree, base, targets)
    p_min = tree[1, 1]
    weights = np.empty(n, dtype=np.float32)
    for k in range(n):
        if idx[k] >= size:  # cannot happen with positive priorities; stay inside the data
            idx[k] = size - 1
        weights[k] = (tree[base + idx[k], 0] / p_min) ** (-beta)
    return idx, weights


@_jit
def first_invalid(values):
    """Position of the first negative or non-finite value, or -1."""
    for k in range(values.shape[0]):
        v = values[k]
        if not (v >= 0.0 and v < np.inf):
            return k
    return -1


class SumTree:
    """Sum and min over ``capacity`` non-negative leaves, updated and searched in batches."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"SumTree capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.base = 1 << (self.capacity - 1).bit_length()
        self.tree = np.zeros((2 * self.base, 2), dtype=np.float64)
        self.tree[:, 1] = np.inf

    @property
    def total(self) -> float:
        return float(self.tree[1, 0])

    @property
    def min(self) -> float:
        """Smallest leaf set so far (+inf when none is)."""
        return float(self.tree[1, 1])

    def _check(self, idx) -> np.ndarray:
        idx = np.ascontiguousarray(idx, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.capacity):
            raise IndexError(f"SumTree index out of range [0, {self.capacity})")
        return idx

    def set(self, idx, values) -> None:
        """Set leaves in order; with a repeated index the last value wins."""
        idx = self._check(idx)
        values = np.ascontiguousarray(values, dtype=np.float64).reshape(-1)
        if values.shape != idx.shape:
            raise ValueError(f"{idx.size} indices but {values.size} values")
        if first_invalid(values) >= 0:
            raise ValueError("SumTree values must be finite and >= 0")
        tree_set(self.tree, self.base, idx, values)

    def get(self, idx) -> np.ndarray:
        return self.tree[self.base + self._check(idx), 0]

    def load(self, values) -> None:
        """Replace all leaves with ``values`` (at most ``capacity`` of them) in one pass."""
        values = np.ascontiguousarray(values, dtype=np.float64).reshape(-1)
        if values.size > self.capacity or first_invalid(values) >= 0:
            raise ValueError(f"load takes at most {self.capacity} finite values >= 0")
        leaves = self.tree[self.base :]
        leaves[:, 0] = 0.0
        leaves[:, 1] = np.inf
        leaves[: values.size, 0] = values
        leaves[: values.size, 1] = values
        tree_rebuild(self.tree, self.base)

    def find(self, targets) -> np.ndarray:
        """Leaf index of each prefix-sum target (see :func:`tree_find`)."""
        if self.total <= 0.0:
            raise ValueError("cannot search a SumTree whose total is 0")
        return tree_find(self.tree, self.base, np.ascontiguousarray(targets, dtype=np.float64).reshape(-1))


def warmup() -> None:
    """Compile (or load from the cache) every kernel once, on tiny arrays."""
    tree = SumTree(4)
    tree.set(np.array([0, 1, 1]), np.array([1.0, 2.0, 3.0]))
    tree.find(np.array([0.5, 3.5]))
    tree.load(np.array([1.0, 2.0]))
    slots = np.array([0, 1], dtype=np.int64)
    per_update(tree.tree, tree.base, 2, slots, np.array([0.5, 1.0]), 0.6, 1e-6, np.empty(0, np.int64), 2, 2, 4)
    per_update(tree.tree, tree.base, 2, slots, np.array([0.5, 1.0]), 0.6, 1e-6, row_ids(slots, 2, 2, 4), 2, 2, 4)
    per_sample(tree.tree, tree.base, 2, np.array([0.1, 0.9]), 0.4)
