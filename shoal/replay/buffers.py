"""Replay buffers: a preallocated ring of column arrays, uniform or prioritized sampling.

Columns are allocated on the first ``add`` from that batch's dtypes and row shapes; later
batches must bring the same columns with the same row shapes (values are cast to the
stored dtype when numpy's "same_kind" rule allows it). When the ring is full the oldest
rows are overwritten. ``Col.INDICES``, ``Col.ROW_IDS`` and ``Col.WEIGHTS`` are outputs of
``sample`` and are not stored if a batch brings them back.

A row's id is its position in the order of all rows ever added (the first row is 0). A
slot's id is a function of the ring position and the add counter alone (no array is kept),
and ``sample`` returns the ids of the rows it drew beside their slots. Priorities computed
later for a slot that has been overwritten since (the ring wrapped while the learner
worked) would land on a newer row: ``update_priorities`` drops them when given the ids.

With ``compression`` ("auto", "lz4" or "none", :mod:`shoal.replay.storage`) large uint8
observation columns keep each row as one lz4 block and are decompressed at sample time;
they behave as plain columns in every other respect (row shape, dtype, slots, state). On the
first add, once the row shapes are known and before anything is allocated, the buffer
estimates what the full ring will hold and raises ConfigError if that exceeds
``memory_share`` of the memory available (``shoal.process.available_memory_bytes``).

State (``get_state``) holds only torch tensors, numbers, strings, lists and dicts, so it
loads with ``torch.load(weights_only=True)`` inside a shoal checkpoint. A compressed column
is saved as its blocks (one uint8 tensor and int64 offsets); ``set_state`` stores each
column as this buffer's ``compression`` says, whichever way it was saved.

A buffer is not thread-safe (the numba kernels release the GIL): use it from one thread, or
through :class:`shoal.replay.ReplayShard`, which serializes calls.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shoal.batch import Batch, Col
from shoal.errors import ConfigError
from shoal.replay import storage
from shoal.replay import sum_tree as st

_OUTPUT_COLUMNS = (Col.INDICES, Col.ROW_IDS, Col.WEIGHTS)
_NO_ROW_IDS = np.empty(0, dtype=np.int64)  # per_update: check no row ids


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _non_negative(name: str, value: Any, strict: bool = False) -> float:
    ok = isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)
    if ok:
        value = float(value)
        ok = np.isfinite(value) and (value > 0 if strict else value >= 0)
    if not ok:
        raise ConfigError(f"{name} must be a finite number {'>' if strict else '>='} 0, got {value!r}")
    return value


def _to_tensor(name: str, array: np.ndarray):
    import torch  # only for checkpoints: replay shard actors start without paying torch's import

    try:
        return torch.from_numpy(np.ascontiguousarray(array).copy())
    except TypeError as e:
        raise TypeError(
            f"replay column '{name}' (dtype {array.dtype}) cannot be saved as a torch tensor: {e}"
        ) from None


class ReplayBuffer:
    """Fixed-capacity FIFO ring of transitions, sampled uniformly with replacement."""

    def __init__(
        self, capacity: int, seed: int | None = None, compression: str = "none", memory_share: float = 1.0
    ) -> None:
        self.capacity = _positive_int("capacity", capacity)
        self.compression = storage.check_compression(compression)
        if self.compression == "lz4":
            storage.lz4_block()  # asked for by name: missing lz4 is an error now, not at the first add
        if not 0 < _non_negative("memory_share", memory_share) <= 1:
            raise ConfigError(f"memory_share must be in (0, 1], got {memory_share!r}")
        self.memory_share = float(memory_share)  # of the available memory this buffer may plan to use
        self._columns: dict[str, storage.PlainColumn | storage.Lz4Column] = {}
        self._pos = 0  # next slot to write
        self._size = 0
        self.added = 0  # rows ever added (including overwritten ones)
        self._rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self._size

    @property
    def columns(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Stored column names -> (row shape, dtype); empty before the first add. Compressed
        columns report the rows they give back (uint8, the row shape added)."""
        return {k: (v.shape, v.dtype) for k, v in self._columns.items()}

    @property
    def compressed_columns(self) -> list[str]:
        return [k for k, v in self._columns.items() if v.compressed]

    @property
    def nbytes(self) -> int:
        """Bytes the stored columns hold (a plain ring counts whole, a compressed column what it holds now)."""
        return sum(v.nbytes for v in self._columns.values())

    # ---- writing -------------------------------------------------------------------------
    def _rows(self, batch: Batch) -> dict[str, np.ndarray]:
        if not isinstance(batch, Batch):
            raise TypeError(f"add() takes a shoal.batch.Batch, got {type(batch).__name__}")
        data = {k: v for k, v in batch.items() if k not in _OUTPUT_COLUMNS}
        if not data:
            raise ValueError("cannot add a batch without columns")
        if not self._columns:
            return data
        if data.keys() != self._columns.keys():
            raise ValueError(f"batch columns {sorted(data)} differ from the buffer's columns {sorted(self._columns)}")
        for k, v in data.items():
            col = self._columns[k]
            if v.shape[1:] != col.shape:
                raise ValueError(f"column '{k}' has rows of shape {v.shape[1:]}, the buffer stores {col.shape}")
            if not np.can_cast(v.dtype, col.dtype, "same_kind"):
                raise ValueError(f"column '{k}' has dtype {v.dtype}, which cannot be stored as {col.dtype}")
        return data

    def _allocate(
        self, specs: dict[str, tuple[tuple[int, ...], np.dtype]], rows: dict[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """Choose each column's storage, check that the full ring fits in memory, then allocate;
        returns ``rows`` prepared for writing (compressed where the column is)."""
        packed = {
            k: storage.pack_rows(rows[k]) if rows[k].dtype != object else rows[k]
            for k in storage.compressed_names(specs, self.compression)
        }
        storage.check_fits(
            self.capacity, storage.estimate_bytes(self.capacity, specs, packed), bool(packed), self.memory_share
        )
        self._columns = {
            k: storage.Lz4Column(self.capacity, shape)
            if k in packed
            else storage.PlainColumn(self.capacity, shape, dtype)
            for k, (shape, dtype) in specs.items()
        }
        return {k: packed.get(k, v) for k, v in rows.items()}

    def _write(self, data: dict[str, np.ndarray], n: int) -> np.ndarray:
        """Write ``n`` rows (n <= capacity) at the ring position; returns the slots."""
        if self._columns:
            data = {k: self._columns[k].prepare(v) for k, v in data.items()}
        else:
            data = self._allocate({k: (v.shape[1:], v.dtype) for k, v in data.items()}, data)
        start = self._pos
        first = min(n, self.capacity - start)
        for k, v in data.items():
            self._columns[k].write(start, first, v)
        slots = np.arange(start, start + n, dtype=np.int64)
        if first < n:
            slots[first:] -= self.capacity
        self._pos = (start + n) % self.capacity
        self._size = min(self._size + n, self.capacity)
        return slots

    def add(self, batch: Batch) -> np.ndarray:
        """Append the batch's rows; returns the slots written (int64).

        A batch longer than the capacity keeps only its last ``capacity`` rows (the earlier
        ones would be overwritten at once) and returns their slots.
        """
        if isinstance(batch, Batch) and len(batch) == 0:
            return np.empty(0, dtype=np.int64)
        data = self._rows(batch)
        n = len(batch)
        if n > self.capacity:
            data = {k: v[n - self.capacity :] for k, v in data.items()}
        slots = self._write(data, min(n, self.capacity))
        self.added += n  # after the write: a refused first add (memory) changes nothing
        return slots

    # ---- reading -------------------------------------------------------------------------
    def _check_sample(self, n: int) -> int:
        n = _positive_int("sample size n", n)
        if self._size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        return n

    def row_ids(self, slots: np.ndarray) -> np.ndarray:
        """Ids of the rows now in ``slots`` (the newest row, in slot ``pos - 1``, has id ``added - 1``)."""
        return st.row_ids(np.ascontiguousarray(slots, dtype=np.int64), self._pos, self.added, self.capacity)

    def _gather(self, idx: np.ndarray) -> Batch:
        out = Batch()
        out.data = {k: v.take(idx) for k, v in self._columns.items()}
        out.data[Col.INDICES] = idx
        out.data[Col.ROW_IDS] = self.row_ids(idx)
        return out

    def sample(self, n: int) -> Batch:
        """``n`` rows drawn uniformly with replacement: slots in ``Col.INDICES``, row ids in ``Col.ROW_IDS``."""
        n = self._check_sample(n)
        return self._gather(self._rng.integers(0, self._size, size=n, dtype=np.int64))

    # ---- state ---------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """Contents and position as torch tensors / plain values (a copy)."""
        return {
            "capacity": self.capacity,
            "pos": self._pos,
            "size": self._size,
            "added": self.added,
            "columns": {
                k: v.state(self._size) if v.compressed else _to_tensor(k, v.rows(self._size))
                for k, v in self._columns.items()
            },
            "rng": self._rng.bit_generator.state,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        if int(state["capacity"]) != self.capacity:
            raise ValueError(f"replay state has capacity {state['capacity']}, this buffer {self.capacity}")
        size = int(state["size"])
        specs, rows = {}, {}
        for k, t in state["columns"].items():
            if isinstance(t, dict):  # a compressed column: its blocks
                shape, rows[k] = storage.unpack_state(k, t, size)
                specs[k] = (shape, np.dtype(np.uint8))
                continue
            a = t.numpy() if hasattr(t, "numpy") else np.asarray(t)
            if len(a) != size:
                raise ValueError(f"replay state column '{k}' has {len(a)} rows, expected {size}")
            specs[k], rows[k] = (a.shape[1:], a.dtype), a
        if specs:
            compress = storage.compressed_names(specs, self.compression)
            for k in [k for k, v in rows.items() if v.dtype == object and k not in compress]:
                rows[k] = storage.unpack_rows(rows[k], specs[k][0])  # saved compressed, stored plain here
            for k, v in self._allocate(specs, rows).items():  # the old contents stay if it does not fit
                self._columns[k].write(0, size, v)
        else:
            self._columns = {}
        self._size, self._pos, self.added = size, int(state["pos"]), int(state["added"])
        self._rng.bit_generator.state = state["rng"]


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay (Schaul et al. 2016) on a sum tree and a min tree.

    Priorities given to ``add`` and ``update_priorities`` are raw ``|TD|`` values; the tree
    stores ``(p + eps) ** alpha``. Rows added without priorities get the largest raw
    priority seen so far (1.0 at the start). ``sample`` is stratified: one draw in each of
    ``n`` equal segments of the total mass.
    """

    def __init__(
        self,
        capacity: int,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        seed: int | None = None,
        compression: str = "none",
        memory_share: float = 1.0,
    ) -> None:
        super().__init__(capacity, seed, compression, memory_share)
        self.alpha = _non_negative("alpha", alpha)
        self.beta = _non_negative("beta", beta)
        self.eps = _non_negative("eps", eps, strict=True)
        self.max_priority = 1.0
        # the priority tree is allocated (and filled) now: 2 x 2 float64 per leaf, leaves rounded up to a power of 2
        tree_bytes = 32 * (1 << (self.capacity - 1).bit_length())
        storage.check_fits(self.capacity, tree_bytes, True, self.memory_share)
        self._tree = st.SumTree(self.capacity)

    def _priorities(self, priorities, n: int) -> np.ndarray:
        p = np.ascontiguousarray(priorities, dtype=np.float64)
        if p.shape != (n,):
            raise ValueError(f"priorities must have shape ({n},), got {p.shape}")
        bad = st.first_invalid(p)
        if bad >= 0:
            raise ValueError(f"priorities must be finite and >= 0; got {p[bad]} at position {bad}")
        return p

    def add(self, batch: Batch, priorities: np.ndarray | None = None) -> np.ndarray:
        """Append rows with raw priorities (None: the max seen so far); returns the slots."""
        n = len(batch)
        p = None if priorities is None else self._priorities(priorities, n)  # checked before any write
        slots = super().add(batch)
        if not len(slots):
            return slots
        p = np.full(len(slots), self.max_priority) if p is None else p[n - len(slots) :]
        self._set_priorities(slots, p)
        return slots

    def _set_priorities(self, idx: np.ndarray, p: np.ndarray, row_ids: np.ndarray = _NO_ROW_IDS) -> int:
        t = self._tree
        bad, max_raw, written = st.per_update(
            t.tree, t.base, self._size, idx, p, self.alpha, self.eps, row_ids, self._pos, self.added, self.capacity
        )
        if bad >= 0:
            what = f"slot {idx[bad]} (the buffer holds {self._size})" if 0 <= p[bad] < np.inf else f"priority {p[bad]}"
            raise ValueError(
                f"invalid {what} at position {bad}: slots must be in [0, size), priorities finite and >= 0"
            )
        if max_raw > self.max_priority:
            self.max_priority = max_raw
        return written

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray, row_ids: np.ndarray | None = None) -> int:
        """Set new raw priorities; with repeated indices the last one wins. Returns how many were set.

        With ``row_ids`` (``Col.ROW_IDS`` of the sampled batch) an entry whose slot has been
        overwritten since it was sampled is dropped instead of landing on the newer row.
        """
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu":
            raise ValueError(f"indices must be integers, got dtype {idx.dtype}")
        idx = np.ascontiguousarray(idx, dtype=np.int64)
        p = np.ascontiguousarray(priorities, dtype=np.float64)
        if idx.ndim != 1 or p.shape != idx.shape:
            raise ValueError(f"indices {idx.shape} and priorities {p.shape} must be 1-D and equally long")
        if row_ids is None:
            return self._set_priorities(idx, p)
        rid = np.ascontiguousarray(row_ids, dtype=np.int64)
        if rid.shape != idx.shape:
            raise ValueError(f"row_ids {rid.shape} and indices {idx.shape} must be equally long")
        return self._set_priorities(idx, p, rid)

    def sample(self, n: int, beta: float | None = None) -> Batch:
        """``n`` stratified prioritized rows with ``Col.WEIGHTS`` (float32), ``Col.INDICES`` and ``Col.ROW_IDS``."""
        n = self._check_sample(n)
        beta = self.beta if beta is None else _non_negative("beta", beta)
        t = self._tree
        idx, weights = st.per_sample(t.tree, t.base, self._size, self._rng.random(n), beta)
        out = self._gather(idx)
        out.data[Col.WEIGHTS] = weights
        return out

    def priorities(self, indices: np.ndarray | None = None) -> np.ndarray:
        """Stored priorities ``(p + eps) ** alpha`` of the given slots (all stored rows by default)."""
        idx = np.arange(self._size) if indices is None else np.asarray(indices, dtype=np.int64)
        return self._tree.get(idx)

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        state.update(
            priorities=_to_tensor("priorities", self.priorities()),
            max_priority=self.max_priority,
            alpha=self.alpha,
            beta=self.beta,
            eps=self.eps,
        )
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore contents and priorities; alpha, beta and eps stay this buffer's own (a state
        saved under another alpha has its priorities re-expressed under this one)."""
        if "priorities" not in state:
            raise ValueError("replay state has no priorities: it was saved from a uniform buffer")
        stored = state["priorities"].numpy().astype(np.float64)
        if len(stored) != int(state["size"]):
            raise ValueError(f"replay state has {len(stored)} priorities for {state['size']} rows")
        super().set_state(state)
        old_alpha = float(state["alpha"])
        if old_alpha != self.alpha and old_alpha > 0:  # re-express under this buffer's alpha
            stored = stored ** (self.alpha / old_alpha)
        self._tree.load(stored)
        self.max_priority = float(state["max_priority"])
