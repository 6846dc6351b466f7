"""Column storage of the replay ring: plain numpy rings, and uint8 rows compressed with lz4.

A :class:`PlainColumn` is one preallocated array of ``capacity`` rows. A
:class:`Lz4Column` keeps each slot's row as one lz4 block (a ``bytes`` object in an object
array, beside an int64 array of their lengths) and decompresses the sampled rows into a
fresh uint8 array of the original row shape. Both write, take and save rows the same way,
so the ring around them (overwriting, slots, row ids, priorities) does not tell them apart.

Which columns are compressed (``compression``):

* ``"auto"``: uint8 observation columns (``Col.OBS``, ``Col.NEXT_OBS``) of at least
  :data:`AUTO_MIN_ROW_BYTES` per row, e.g. stacked Atari frames (28,224 bytes per row);
* ``"lz4"``: every uint8 observation column, whatever its row size (a buffer without one
  is a config error);
* ``"none"``: none.

Stacked Atari frames compress about 50x (4x84x84 Pong stacks: 28,224 bytes to about 530,
in about 6 us; about 5 us back; benchmarks/README.md), so sampling spends a few
microseconds per row to keep replay about 25 times smaller.

Before a ring is allocated, :func:`check_fits` compares its estimated size with the memory
available (``MemAvailable`` of ``/proc/meminfo``; no check where that cannot be read): a
plain array's pages are only touched as rows arrive, so ``np.zeros`` of a ring too large
succeeds and the process is killed for memory hours later.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from shoal import process
from shoal.batch import Col
from shoal.errors import ConfigError

COMPRESSION_MODES = ("auto", "lz4", "none")
AUTO_MIN_ROW_BYTES = 1024  # "auto" compresses uint8 observation rows of at least this many bytes
OBSERVATION_COLUMNS = (Col.OBS, Col.NEXT_OBS)
# Per stored compressed row, besides the block itself: the bytes object's header (33), the
# allocator's header and rounding (measured: 57 in all with the slot's 8-byte pointer), and
# the slot's length (int64).
ROW_OVERHEAD_BYTES = 64 + 8
ESTIMATE_SAFETY = 2.0  # compressed rows later in a run may compress worse than the first batch's


def check_compression(mode: Any) -> str:
    if mode not in COMPRESSION_MODES:
        raise ConfigError(f"replay_compression must be one of {', '.join(COMPRESSION_MODES)}; got {mode!r}")
    return mode


def lz4_block():
    """The ``lz4.block`` module, or a ConfigError that says how to install it."""
    try:
        import lz4.block
    except ImportError:
        raise ConfigError(
            "replay_compression stores uint8 observations compressed with lz4, which is not installed: "
            "pip install -e '.[atari]' in the shoal checkout (or pip install lz4), or set replay_compression: none"
        ) from None
    return lz4.block


def row_nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return int(math.prod(shape)) * np.dtype(dtype).itemsize


def compressed_names(specs: dict[str, tuple[tuple[int, ...], np.dtype]], mode: str) -> list[str]:
    """The columns of ``specs`` (name -> (row shape, dtype)) that ``mode`` stores compressed."""
    if mode == "none":
        return []
    names = [
        k
        for k in OBSERVATION_COLUMNS
        if k in specs
        and np.dtype(specs[k][1]) == np.uint8
        and (mode == "lz4" or row_nbytes(*specs[k]) >= AUTO_MIN_ROW_BYTES)
    ]
    if mode == "lz4" and not names:
        found = ", ".join(
            f"{k} {np.dtype(specs[k][1])} {tuple(specs[k][0])}" for k in OBSERVATION_COLUMNS if k in specs
        )
        raise ConfigError(
            f"replay_compression lz4 compresses uint8 observation columns, and these rows have none "
            f"({found or 'no obs or next_obs column'}): set replay_compression to auto or none"
        )
    if names:
        lz4_block()
    return names


def pack_rows(rows: np.ndarray) -> np.ndarray:
    """One lz4 block per row (without the size header: a column knows its row size), as an object array."""
    compress = lz4_block().compress
    flat = np.ascontiguousarray(rows).reshape(len(rows), -1)
    out = np.empty(len(rows), dtype=object)
    out[:] = [compress(r, store_size=False) for r in flat]
    return out


def unpack_rows(blocks: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The uint8 rows of ``shape`` that :func:`pack_rows` made ``blocks`` of, in a new array."""
    out = np.empty((len(blocks),) + tuple(shape), dtype=np.uint8)
    n = row_nbytes(shape, out.dtype)
    flat, decompress = memoryview(out).cast("B"), lz4_block().decompress
    for j, block in enumerate(blocks.tolist()):
        row = decompress(block, uncompressed_size=n)
        if len(row) != n:
            raise ValueError(f"a compressed replay row holds {len(row)} bytes, expected {n}")
        flat[j * n : (j + 1) * n] = row
    return out


def block_lengths(blocks: np.ndarray) -> np.ndarray:
    return np.fromiter(map(len, blocks), dtype=np.int64, count=len(blocks))


def estimate_bytes(
    capacity: int, specs: dict[str, tuple[tuple[int, ...], np.dtype]], packed: dict[str, np.ndarray]
) -> int:
    """Bytes a full ring will hold: plain columns exactly; a compressed column from the mean
    block size of ``packed`` (rows at hand) times :data:`ESTIMATE_SAFETY`, plus the per-row overhead."""
    total = 0.0
    for k, spec in specs.items():
        if k in packed:
            mean = float(block_lengths(packed[k]).mean()) if len(packed[k]) else float(row_nbytes(*spec))
            total += capacity * (ESTIMATE_SAFETY * mean + ROW_OVERHEAD_BYTES)
        else:
            total += capacity * row_nbytes(*spec)
    return int(total)


def check_fits(capacity: int, needed: int, compressed: bool, share: float = 1.0) -> None:
    """ConfigError if ``needed`` bytes exceed ``share`` of the memory available now
    (:func:`shoal.process.available_memory_bytes`, looked up at each call so that tests can replace it)."""
    avail = process.available_memory_bytes()
    if avail is None:
        return
    allowed = avail * share
    if needed <= allowed:
        return
    whose = (
        ""
        if share >= 1
        else (
            f" to it ({share:.0%} of the {avail / process.GB:.1f} GB available: the replay shards of a "
            "run share the machine equally)"
        )
    )
    remedy = (
        "lower replay_capacity"
        if compressed
        else "lower replay_capacity, or set replay_compression to auto or lz4 (uint8 observations stored compressed)"
    )
    raise ConfigError(
        f"replay_capacity is too large for this machine's memory: a replay buffer of {capacity:,} rows "
        f"needs about {needed / process.GB:.1f} GB ({needed / capacity:,.0f} bytes per row), and "
        f"{allowed / process.GB:.1f} GB is available{whose}. To fit, {remedy}. Nothing was allocated."
    )


# ---- columns ----------------------------------------------------------------------------
class PlainColumn:
    """``capacity`` rows in one preallocated array."""

    compressed = False

    def __init__(self, capacity: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.array = np.zeros((capacity,) + tuple(shape), dtype=dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape[1:]

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype

    @property
    def nbytes(self) -> int:
        return self.array.nbytes

    def prepare(self, rows: np.ndarray) -> np.ndarray:
        return rows

    def write(self, start: int, first: int, rows: np.ndarray) -> None:
        """Rows ``[:first]`` into slots ``start...``, the rest (the ring wrapped) into slots ``0...``."""
        self.array[start : start + first] = rows[:first]
        if first < len(rows):
            self.array[: len(rows) - first] = rows[first:]

    def take(self, idx: np.ndarray) -> np.ndarray:
        return np.take(self.array, idx, axis=0)  # faster than array[idx]

    def rows(self, size: int) -> np.ndarray:
        return self.array[:size]


class Lz4Column:
    """``capacity`` uint8 rows, each slot one lz4 block; sampled rows come back uint8 in the row shape."""

    compressed = True

    def __init__(self, capacity: int, shape: tuple[int, ...]) -> None:
        lz4_block()
        self.shape, self.dtype = tuple(shape), np.dtype(np.uint8)
        self.blocks = np.empty(capacity, dtype=object)  # None until a slot is written
        self.lengths = np.zeros(capacity, dtype=np.int64)
        self.stored_bytes = 0  # sum of lengths

    @property
    def nbytes(self) -> int:
        """Bytes held: the blocks, their per-row overhead, and the slot and length arrays."""
        return (
            self.stored_bytes
            + int(np.count_nonzero(self.lengths)) * (ROW_OVERHEAD_BYTES - 16)
            + self.blocks.nbytes
            + self.lengths.nbytes
        )

    def prepare(self, rows: np.ndarray) -> np.ndarray:
        return pack_rows(rows.astype(np.uint8, copy=False))  # what a plain uint8 ring's assignment would store

    def write(self, start: int, first: int, blocks: np.ndarray) -> None:
        lengths = block_lengths(blocks)
        for s, b, ln in (
            (slice(start, start + first), blocks[:first], lengths[:first]),
            (slice(0, len(blocks) - first), blocks[first:], lengths[first:]),
        ):
            self.stored_bytes += int(ln.sum()) - int(self.lengths[s].sum())
            self.blocks[s] = b
            self.lengths[s] = ln

    def take(self, idx: np.ndarray) -> np.ndarray:
        return unpack_rows(self.blocks[idx], self.shape)

    def state(self, size: int) -> dict[str, Any]:
        """The first ``size`` blocks as one uint8 tensor and int64 offsets (``weights_only`` loadable)."""
        import torch

        offsets = np.zeros(size + 1, dtype=np.int64)
        np.cumsum(self.lengths[:size], out=offsets[1:])
        data = np.frombuffer(bytearray().join(self.blocks[:size].tolist()), dtype=np.uint8)
        return {
            "codec": "lz4",
            "row_shape": list(self.shape),
            "dtype": "uint8",
            "data": torch.from_numpy(data),
            "offsets": torch.from_numpy(offsets),
        }


def unpack_state(name: str, state: dict[str, Any], size: int) -> tuple[tuple[int, ...], np.ndarray]:
    """(row shape, object array of blocks) from :meth:`Lz4Column.state`."""
    if state.get("codec") != "lz4" or state.get("dtype") != "uint8":
        raise ValueError(
            f"replay state column '{name}' is stored with codec {state.get('codec')!r} "
            f"({state.get('dtype')!r}); this version reads lz4 (uint8)"
        )
    offsets = state["offsets"].numpy()
    if len(offsets) != size + 1:
        raise ValueError(f"replay state column '{name}' has {len(offsets) - 1} rows, expected {size}")
    data = state["data"].numpy().tobytes()
    blocks = np.empty(size, dtype=object)
    blocks[:] = [data[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
    return tuple(int(d) for d in state["row_shape"]), blocks
