"""Prioritized replay throughput: shoal's PrioritizedReplayBuffer against cpprb, same run.

Both buffers get the same CartPole-like columns (obs and next_obs float32 x 4, action
int64, reward float32, terminated bool, discount float32), the same alpha (0.6), beta
(0.4) and eps (1e-6), and are filled to capacity (default 1,000,000) before timing. Then,
in alternating rounds (shoal, cpprb, shoal, cpprb, ...) of ``--seconds`` each, we count:

* sample+update cycles: ``sample(512, beta)`` then ``update_priorities`` of those 512 slots
  with new |TD|-like priorities (pre-drawn, the same arrays for both libraries); shoal's
  update gets the sampled row ids too, as Ape-X sends them (entries whose slot was
  overwritten since the sample are dropped: here, none are);
* adds: one batch of 512 rows (with priorities) into the full ring.

Figures are batches per second, the median over rounds. numba kernels are compiled (or
loaded from the cache) and each buffer is exercised before any timing. Windows are short and
alternate (which library goes first swaps every round) so that both libraries see the same
background load on a shared machine; ``ratio_per_round`` lists the paired ratios. cpprb is an
optional benchmark-only dependency (``pip install -e .[bench]``).

Pong frames (run first, on a fresh heap; needs ale-py, ``pip install -e .[atari]``): a
prioritized buffer with ``compression="auto"`` at ``--pong-capacity`` (default 1,000,000)
rows of real Pong transitions: obs and next_obs are flat 4x84x84 uint8 stacks (28,224 bytes
each) from ``ale_py.vector_env.AtariVectorEnv("pong", 8, repeat_action_probability=0.25,
reward_clipping=False, use_fire_reset=False)`` under random actions. ``--pong-distinct``
(default 20,000) distinct transitions are generated; the ring is filled by adding them again
and again in chunks of 10,000, so most rows are repeats standing in for new play (they
compress as well as the rows they repeat, no better; random play's frames change less than
a trained agent's, so real runs may compress somewhat worse). Then, over ``--rounds``
windows of ``--seconds``, sample+update of ``--batch`` rows as above (obs and next_obs of
every sampled row decompressed). Reported:

* ``pong_bytes_per_transition``: growth of the resident set (``/proc/self/statm``) from just
  before the buffer is built to just after the fill, per stored row (sum tree included);
* ``pong_buffer_bytes_per_transition``: the buffer's own account (``nbytes``: blocks, their
  per-row overhead, the slot and length arrays, the plain columns) per row;
* ``pong_estimate_bytes_per_transition``: what the memory check planned for per row (2x the
  first chunk's mean block, plus overhead);
* ``pong_naive_bytes_per_transition``: a plain ring's row (28,224 x 2 + the other columns);
* ``pong_sample_update_batches_per_s``: the median rate.

``--pong-capacity 0`` skips the case; without ale-py it is skipped with a note on stderr and
its keys are null. The process keeps freed memory for reuse (``shoal.process.retain_freed_memory``,
as every shoal process and Ape-X's replay shards do): without it, each sample's two fresh
14 MB arrays of decompressed rows are new pages, and the Pong rate about halves.

    python benchmarks/replay.py [--capacity 1000000] [--batch 512] [--seconds 0.5] [--rounds 20]
                                [--pong-capacity 1000000] [--pong-distinct 20000]

Progress goes to stderr; the last stdout line is one JSON object:
``{"benchmark": "replay", "shoal_sample_update_per_s", "cpprb_sample_update_per_s", "ratio",
"shoal_add_per_s", "cpprb_add_per_s", ..., "pong_bytes_per_transition",
"pong_naive_bytes_per_transition", "pong_sample_update_batches_per_s", ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

from shoal.batch import Batch, Col
from shoal.process import retain_freed_memory
from shoal.replay import PrioritizedReplayBuffer, storage, warmup

ALPHA, BETA, EPS = 0.6, 0.4, 1e-6
COLUMNS = {  # name -> (row shape, dtype)
    Col.OBS: ((4,), np.float32),
    Col.NEXT_OBS: ((4,), np.float32),
    Col.ACTIONS: ((), np.int64),
    Col.REWARDS: ((), np.float32),
    Col.TERMINATEDS: ((), np.bool_),
    Col.DISCOUNTS: ((), np.float32),
}


def log(msg: str) -> None:
    print(f"[replay] {msg}", file=sys.stderr, flush=True)


def random_rows(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    out = {}
    for name, (shape, dtype) in COLUMNS.items():
        if dtype == np.bool_:
            out[name] = rng.random((n,) + shape) < 0.01
        elif np.issubdtype(dtype, np.integer):
            out[name] = rng.integers(0, 2, (n,) + shape, dtype=dtype)
        else:
            out[name] = rng.random((n,) + shape, dtype=np.float32).astype(dtype)
    return out


class Shoal:
    name = "shoal"

    def __init__(self, capacity: int) -> None:
        self.buf = PrioritizedReplayBuffer(capacity, alpha=ALPHA, beta=BETA, eps=EPS, seed=0)

    def add(self, rows: dict, priorities: np.ndarray) -> None:
        self.buf.add(Batch(rows), priorities)

    def sample_update(self, n: int, priorities: np.ndarray) -> None:
        batch = self.buf.sample(n, BETA)
        self.buf.update_priorities(batch[Col.INDICES], priorities, batch[Col.ROW_IDS])

    def __len__(self) -> int:
        return len(self.buf)


class Cpprb:
    name = "cpprb"

    def __init__(self, capacity: int) -> None:
        import cpprb

        env_dict = {name: {"shape": shape or 1, "dtype": dtype} for name, (shape, dtype) in COLUMNS.items()}
        self.buf = cpprb.PrioritizedReplayBuffer(capacity, env_dict, alpha=ALPHA, eps=EPS)

    def add(self, rows: dict, priorities: np.ndarray) -> None:
        self.buf.add(priorities=priorities, **rows)

    def sample_update(self, n: int, priorities: np.ndarray) -> None:
        batch = self.buf.sample(n, beta=BETA)
        self.buf.update_priorities(batch["indexes"], priorities)

    def __len__(self) -> int:
        return self.buf.get_stored_size()


def rate(fn, seconds: float) -> float:
    """Calls of ``fn(i)`` per second over a window of ``seconds``."""
    count, t0 = 0, time.perf_counter()
    while True:
        fn(count)
        count += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return count / elapsed


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def pong_transitions(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """About ``n`` one-step transitions of random play in Pong (8 envs), obs and next_obs flat
    uint8 stacks. Written into one preallocated array of stacks (obs and next_obs are views of it)."""
    from ale_py.vector_env import AtariVectorEnv

    envs = AtariVectorEnv("pong", 8, repeat_action_probability=0.25, reward_clipping=False, use_fire_reset=False)
    steps = -(-n // 8)
    stacks = np.empty((steps + 1, 8, 4, 84, 84), dtype=np.uint8)
    actions = np.empty((steps, 8), dtype=np.int64)
    rewards = np.empty((steps, 8), dtype=np.float32)
    terminated = np.empty((steps, 8), dtype=np.bool_)
    rng = np.random.default_rng(seed)
    try:
        stacks[0], _ = envs.reset(seed=seed)
        for t in range(steps):
            actions[t] = rng.integers(0, envs.single_action_space.n, 8)
            stacks[t + 1], rewards[t], terminated[t], _, _ = envs.step(actions[t])
    finally:
        envs.close()
    flat = stacks.reshape(steps + 1, 8, -1)
    return {
        Col.OBS: flat[:-1].reshape(steps * 8, -1),
        Col.ACTIONS: actions.ravel(),
        Col.REWARDS: rewards.ravel(),
        Col.NEXT_OBS: flat[1:].reshape(steps * 8, -1),
        Col.TERMINATEDS: terminated.ravel(),
        Col.DISCOUNTS: np.full(steps * 8, 0.99, dtype=np.float32),
    }


def pong_case(args: argparse.Namespace, rng: np.random.Generator) -> dict:
    keys = (
        "pong_bytes_per_transition",
        "pong_buffer_bytes_per_transition",
        "pong_estimate_bytes_per_transition",
        "pong_naive_bytes_per_transition",
        "pong_sample_update_batches_per_s",
        "pong_mean_block_bytes",
        "pong_fill_s",
        "pong_capacity",
        "pong_distinct_transitions",
    )
    out = dict.fromkeys(keys)
    if args.pong_capacity <= 0:
        return out
    try:
        import ale_py  # noqa: F401
    except ImportError:
        log("Pong case skipped: ale-py is not installed (pip install -e .[atari])")
        return out
    t0 = time.perf_counter()
    rows = pong_transitions(args.pong_distinct)
    distinct = len(rows[Col.OBS])
    log(f"{distinct:,} distinct Pong transitions in {time.perf_counter() - t0:.1f}s")

    capacity, chunk = args.pong_capacity, 10_000
    rss0 = resident_bytes()
    buf = PrioritizedReplayBuffer(capacity, alpha=ALPHA, beta=BETA, eps=EPS, seed=0, compression="auto")
    t0 = time.perf_counter()
    estimate = None
    for start in range(0, capacity, chunk):  # repeats of the distinct rows stand in for new play
        n = min(chunk, capacity - start)
        idx = (start + np.arange(n)) % distinct
        lo = int(idx[0])
        part = (
            {k: v[lo : lo + n] for k, v in rows.items()} if lo + n <= distinct else {k: v[idx] for k, v in rows.items()}
        )
        buf.add(Batch(part), rng.random(n) * 2.0)
        if estimate is None:
            cols = buf.compressed_columns
            estimate = storage.estimate_bytes(capacity, buf.columns, {k: buf._columns[k].blocks[:n] for k in cols})
        del part  # a copy where the chunk wraps around the distinct rows: not part of the buffer
    fill_s = time.perf_counter() - t0
    grown = resident_bytes() - rss0
    blocks = buf._columns[Col.OBS].lengths
    log(f"filled {len(buf):,} rows in {fill_s:.1f}s; resident +{grown / 1e9:.2f} GB, buffer {buf.nbytes / 1e9:.2f} GB")

    new_prios = [rng.random(args.batch) * 2.0 for _ in range(64)]

    def sample_update(i: int) -> None:
        b = buf.sample(args.batch, BETA)
        buf.update_priorities(b[Col.INDICES], new_prios[i % 64], b[Col.ROW_IDS])

    rate(sample_update, 0.5)  # warm-up outside timing
    rates = [rate(sample_update, args.seconds) for _ in range(args.rounds)]
    log(f"Pong sample+update: median {statistics.median(rates):,.0f} batches/s over {args.rounds} windows")
    naive = sum(v[:1].nbytes for v in rows.values())
    out.update(
        pong_bytes_per_transition=round(grown / capacity, 1),
        pong_buffer_bytes_per_transition=round(buf.nbytes / capacity, 1),
        pong_estimate_bytes_per_transition=round(estimate / capacity, 1),
        pong_naive_bytes_per_transition=naive,
        pong_sample_update_batches_per_s=round(statistics.median(rates), 1),
        pong_mean_block_bytes=round(float(blocks.mean()), 1),
        pong_fill_s=round(fill_s, 1),
        pong_capacity=capacity,
        pong_distinct_transitions=distinct,
    )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--capacity", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--seconds", type=float, default=0.5, help="length of each timed window")
    p.add_argument("--rounds", type=int, default=20, help="alternating rounds per library and operation")
    p.add_argument("--pong-capacity", type=int, default=1_000_000, help="rows of the Pong-frame case (0 skips it)")
    p.add_argument("--pong-distinct", type=int, default=20_000, help="distinct Pong transitions generated")
    args = p.parse_args()
    rng = np.random.default_rng(0)

    retain_freed_memory()
    t0 = time.perf_counter()
    warmup()
    log(f"numba kernels ready in {time.perf_counter() - t0:.2f}s")
    pong = pong_case(args, rng)  # first: its resident-set growth is measured on a fresh heap
    libs = [Shoal(args.capacity), Cpprb(args.capacity)]

    chunk = 65_536
    for start in range(0, args.capacity, chunk):  # the same rows and priorities into both
        n = min(chunk, args.capacity - start)
        rows, prio = random_rows(rng, n), rng.random(n) * 2.0
        for lib in libs:
            lib.add(rows, prio)
    log(f"filled both buffers to {[len(lib) for lib in libs]} rows")

    pool = 64  # pre-drawn inputs, cycled, identical for both libraries
    new_prios = [rng.random(args.batch) * 2.0 for _ in range(pool)]
    add_rows = [random_rows(rng, args.batch) for _ in range(pool)]
    ops = {
        "sample_update": lambda lib: lambda i: lib.sample_update(args.batch, new_prios[i % pool]),
        "add": lambda lib: lambda i: lib.add(add_rows[i % pool], new_prios[i % pool]),
    }
    for lib in libs:  # warm-up outside timing
        for op in ops.values():
            rate(op(lib), 0.2)

    results: dict[str, dict[str, list[float]]] = {op: {lib.name: [] for lib in libs} for op in ops}
    for r in range(args.rounds):
        for op_name, op in ops.items():
            for lib in libs if r % 2 == 0 else libs[::-1]:
                results[op_name][lib.name].append(rate(op(lib), args.seconds))
        if (r + 1) % max(1, args.rounds // 5) == 0:
            log(
                f"round {r + 1}/{args.rounds}: "
                + ", ".join(f"{op} {lib}={v[-1]:,.0f}/s" for op, per in results.items() for lib, v in per.items())
            )

    med = {op: {lib: statistics.median(v) for lib, v in per.items()} for op, per in results.items()}
    out = {
        "benchmark": "replay",
        "shoal_sample_update_per_s": round(med["sample_update"]["shoal"], 1),
        "cpprb_sample_update_per_s": round(med["sample_update"]["cpprb"], 1),
        "ratio": round(med["sample_update"]["shoal"] / med["sample_update"]["cpprb"], 3),
        "shoal_add_per_s": round(med["add"]["shoal"], 1),
        "cpprb_add_per_s": round(med["add"]["cpprb"], 1),
        "add_ratio": round(med["add"]["shoal"] / med["add"]["cpprb"], 3),
        "ratio_per_round": [
            round(a / b, 2) for a, b in zip(results["sample_update"]["shoal"], results["sample_update"]["cpprb"])
        ],
        "capacity": args.capacity,
        "batch": args.batch,
        "rounds": args.rounds,
        "seconds": args.seconds,
        **pong,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
