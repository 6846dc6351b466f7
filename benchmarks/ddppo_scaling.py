"""DD-PPO scaling on CartPole-v1: env steps/s with 1 and 2 workers, and time to a mean return of 450.

Throughput: each worker does the same work per round (the preset's 128 envs x 64 steps, 8
epochs of one 8192-row minibatch, one gradient all-reduce per minibatch), so with perfect
scaling 2 workers sample and train twice the env steps per second of 1. The 1- and 2-worker
runs alternate (``--repeats`` times each, medians reported) so that load from other
processes on a shared machine hits both alike; each run discards its first
``--warmup`` iterations (worker start-up) and then times ``--iters`` iterations.

Time to solve: a fresh process trains the preset (2 workers) until ``episode_return_mean``
(last 100 training episodes) reaches 450; the time counts from the process spawn, so Ray
start, worker start and imports are included (``train_seconds_to_solve`` leaves them out).

    python benchmarks/ddppo_scaling.py [--repeats 2] [--iters 20] [--max-seconds 240]

Progress goes to stderr; the last stdout line is one JSON object:
``{"benchmark": "ddppo_scaling", "env_steps_per_s_1_worker", "env_steps_per_s_2_workers",
"ratio", "allreduce_ms_per_minibatch", "seconds_to_solve_2_workers", ...}``; the env steps/s
figures are sampled steps (every sampled step is also trained: ``trained_*`` keys), and
``allreduce_ms_per_minibatch`` is the 2-worker figure (flatten, gloo all-reduce, copy back,
including the wait for the slower peer).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PRESET = REPO / "examples" / "ddppo_cartpole.yaml"
TARGET = 450.0


def log(msg: str) -> None:
    print(f"[ddppo_scaling] {msg}", file=sys.stderr, flush=True)


def preset(num_workers: int, seed: int) -> dict:
    from shoal.config import load_yaml

    data = load_yaml(PRESET)
    data.pop("stop", None)
    data.pop("algo", None)
    data["seed"] = seed
    data["resources"]["num_workers"] = num_workers
    return data


def throughput(num_workers: int, warmup: int, iters: int, seed: int) -> dict:
    """Sampled and trained env steps per second over ``iters`` iterations after ``warmup``."""
    from shoal.algorithms.ddppo import DDPPOConfig

    algo = DDPPOConfig(**preset(num_workers, seed)).build()
    try:
        for _ in range(warmup):
            r = algo.train()
        s0, tr0, t0 = r["env_steps_sampled"], r["env_steps_trained"], time.perf_counter()
        allreduce = []
        for _ in range(iters):
            r = algo.train()
            allreduce.append(r["allreduce_ms_per_minibatch"])
        dt = time.perf_counter() - t0
        return {
            "workers": num_workers,
            "env_steps_per_s": (r["env_steps_sampled"] - s0) / dt,
            "env_steps_trained_per_s": (r["env_steps_trained"] - tr0) / dt,
            "allreduce_ms_per_minibatch": statistics.median(allreduce),
            "seconds": dt,
            "learn_ms_per_round": 1000 * r.get("learner/learn_time_s", float("nan")),
            "sample_ms_per_round": 1000 * r.get("learner/sample_time_s", float("nan")),
        }
    finally:
        algo.stop()


def independent(num_workers: int, warmup: int, iters: int, seed: int) -> dict:
    """The same workers and work per round with no process group (no all-reduce): what the machine allows."""
    from shoal.algorithms.ddppo import DDPPOConfig, DDPPOWorker
    from shoal.runtime import make_actor_group

    cfg = DDPPOConfig(**preset(num_workers, seed))
    group = make_actor_group(DDPPOWorker, num_workers, lambda i: ((cfg, i), {}), remote=True, name="baseline worker")
    try:
        for _ in range(warmup):
            group.foreach("sample_and_train")
        t0, steps = time.perf_counter(), 0
        for _ in range(iters):
            steps += sum(r.metrics.env_steps for r in group.foreach("sample_and_train"))
        return {"workers": num_workers, "env_steps_per_s": steps / (time.perf_counter() - t0)}
    finally:
        group.stop()


def child_solve(spawn_time: float, max_seconds: float, seed: int) -> dict:
    from shoal import runtime
    from shoal.algorithms.ddppo import DDPPOConfig

    algo = DDPPOConfig(**preset(2, seed)).build()
    out = {"solved": False, "seconds_to_solve": None, "train_seconds_to_solve": None, "env_steps_to_solve": None}
    try:
        t_build = time.time()
        while time.time() - spawn_time < max_seconds:
            r = algo.train()
            log(
                f"solve: it {r['iteration']}: return {r['episode_return_mean']:.1f}, {r['env_steps_sampled']} steps, "
                f"{time.time() - spawn_time:.1f} s"
            )
            if r["episode_return_mean"] >= TARGET:
                out.update(
                    solved=True,
                    seconds_to_solve=time.time() - spawn_time,
                    train_seconds_to_solve=time.time() - t_build,
                    env_steps_to_solve=r["env_steps_sampled"],
                )
                break
    finally:
        algo.stop()
        runtime.shutdown()
    return out


def run_solve(max_seconds: float, seed: int) -> dict:
    spawn = time.time()
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child-solve",
        "--spawn-time",
        repr(spawn),
        "--max-seconds",
        str(max_seconds),
        "--seed",
        str(seed),
    ]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, cwd=REPO, timeout=max_seconds + 120)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"solved": False, "error": f"child exited with code {proc.returncode}"}
    return json.loads(lines[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=2, help="alternating 1-/2-worker runs of each")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--max-seconds", type=float, default=240.0, help="time-to-solve budget, from process start")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child-solve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--spawn-time", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.child_solve:
        print(json.dumps(child_solve(args.spawn_time or time.time(), args.max_seconds, args.seed)), flush=True)
        return

    import torch

    from shoal import runtime

    torch.set_num_threads(1)
    runtime.start()
    runs: dict[int, list[dict]] = {1: [], 2: []}
    base: dict[int, list[dict]] = {1: [], 2: []}  # same work, no process group: the machine's own scaling
    try:
        for rep in range(args.repeats):
            for w in (1, 2):
                r = throughput(w, args.warmup, args.iters, args.seed + rep)
                log(
                    f"repeat {rep}, {w} worker(s): {r['env_steps_per_s']:.0f} sampled steps/s, "
                    f"{r['env_steps_trained_per_s']:.0f} trained steps/s, all-reduce {r['allreduce_ms_per_minibatch']:.2f} ms/minibatch, "
                    f"round: sample {r['sample_ms_per_round']:.0f} ms + learn {r['learn_ms_per_round']:.0f} ms"
                )
                runs[w].append(r)
                b = independent(w, args.warmup, args.iters, args.seed + rep)
                log(f"repeat {rep}, {w} independent worker(s), no all-reduce: {b['env_steps_per_s']:.0f} steps/s")
                base[w].append(b)
    finally:
        runtime.shutdown()

    def med(w: int, key: str, of: dict = runs) -> float:
        return statistics.median(r[key] for r in of[w])

    log("time to solve: a fresh process with 2 workers")
    solve = run_solve(args.max_seconds, args.seed)
    log(f"solve: {solve}")
    one, two = med(1, "env_steps_per_s"), med(2, "env_steps_per_s")
    print(
        json.dumps(
            {
                "benchmark": "ddppo_scaling",
                "env_steps_per_s_1_worker": one,
                "env_steps_per_s_2_workers": two,
                "ratio": two / one,
                "allreduce_ms_per_minibatch": med(2, "allreduce_ms_per_minibatch"),
                "seconds_to_solve_2_workers": solve.get("seconds_to_solve"),
                "trained_env_steps_per_s_1_worker": med(1, "env_steps_trained_per_s"),
                "trained_env_steps_per_s_2_workers": med(2, "env_steps_trained_per_s"),
                "trained_ratio": med(2, "env_steps_trained_per_s") / med(1, "env_steps_trained_per_s"),
                "independent_env_steps_per_s_1_worker": med(1, "env_steps_per_s", base),
                "independent_env_steps_per_s_2_workers": med(2, "env_steps_per_s", base),
                "independent_ratio": med(2, "env_steps_per_s", base) / med(1, "env_steps_per_s", base),
                "train_seconds_to_solve_2_workers": solve.get("train_seconds_to_solve"),
                "env_steps_to_solve_2_workers": solve.get("env_steps_to_solve"),
                "backend": "gloo",
                "device": "cpu",
                "repeats": args.repeats,
                "iters": args.iters,
                "runs": runs,
                "config": str(PRESET.relative_to(REPO)),
            }
        )
    )


if __name__ == "__main__":
    main()
