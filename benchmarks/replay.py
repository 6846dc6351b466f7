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

    python benchmarks/replay.py [--capacity 1000000] [--batch 512] [--seconds 0.5] [--rounds 20]

Progress goes to stderr; the last stdout line is one JSON object:
``{"benchmark": "replay", "shoal_sample_update_per_s", "cpprb_sample_update_per_s", "ratio",
"shoal_add_per_s", "cpprb_add_per_s", ...}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from shoal.batch import Batch, Col
from shoal.replay import PrioritizedReplayBuffer, warmup

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--capacity", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--seconds", type=float, default=0.5, help="length of each timed window")
    p.add_argument("--rounds", type=int, default=20, help="alternating rounds per library and operation")
    args = p.parse_args()
    rng = np.random.default_rng(0)

    t0 = time.perf_counter()
    warmup()
    log(f"numba kernels ready in {time.perf_counter() - t0:.2f}s")
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
            for lib in (libs if r % 2 == 0 else libs[::-1]):
                results[op_name][lib.name].append(rate(op(lib), args.seconds))
        if (r + 1) % max(1, args.rounds // 5) == 0:
            log(f"round {r + 1}/{args.rounds}: " + ", ".join(
                f"{op} {lib}={v[-1]:,.0f}/s" for op, per in results.items() for lib, v in per.items()))

    med = {op: {lib: statistics.median(v) for lib, v in per.items()} for op, per in results.items()}
    out = {
        "benchmark": "replay",
        "shoal_sample_update_per_s": round(med["sample_update"]["shoal"], 1),
        "cpprb_sample_update_per_s": round(med["sample_update"]["cpprb"], 1),
        "ratio": round(med["sample_update"]["shoal"] / med["sample_update"]["cpprb"], 3),
        "shoal_add_per_s": round(med["add"]["shoal"], 1),
        "cpprb_add_per_s": round(med["add"]["cpprb"], 1),
        "add_ratio": round(med["add"]["shoal"] / med["add"]["cpprb"], 3),
        "ratio_per_round": [round(a / b, 2) for a, b in zip(results["sample_update"]["shoal"],
                                                             results["sample_update"]["cpprb"])],
        "capacity": args.capacity,
        "batch": args.batch,
        "rounds": args.rounds,
        "seconds": args.seconds,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
