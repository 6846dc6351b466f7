"""IMPALA on CartPole-v1: wall seconds and env steps to a mean return of 450, throughput, learner idle time.

Each seed runs in a fresh Python process (this script in child mode), so interpreter start,
imports and (with ``resources.num_workers > 0``) Ray start-up are part of the time.
"Solved" means the ``episode_return_mean`` that ``algo.train()`` returns (mean of the last
100 training episodes) first reaches 450.

    python benchmarks/impala_cartpole.py [--seeds 3] [--config examples/impala_cartpole.yaml] [--max-seconds 120]

``benchmarks/appo_cartpole.py`` is the same script for APPO. Progress goes to stderr; the
last stdout line is one JSON object: ``{"benchmark", "solved", "seconds_to_solve",
"env_steps_to_solve", "sampled_env_steps_per_s", "trained_env_steps_per_s",
"learner_idle_fraction", "seeds", "per_seed", "config"}``. ``solved`` is true when every seed
solved; the figures are medians over the seeds (time and steps over the solved ones, null
when none solved). Throughputs are env steps over training time (``time_total_s``); the idle
fraction is the mean of the per-iteration values the learner thread reports.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from _spawn import run_child

REPO = Path(__file__).resolve().parent.parent
TARGET = 450.0


def log(name: str, msg: str) -> None:
    print(f"[{name}_cartpole] {msg}", file=sys.stderr, flush=True)


# ---- child: one seed in this (fresh) process ------------------------------------------------
def child(algo_name: str, seed: int, config: str, spawn_time: float, max_seconds: float) -> dict:
    import torch

    from shoal import runtime
    from shoal.algorithms import get_config_class
    from shoal.config import load_yaml

    torch.set_num_threads(1)
    data = load_yaml(config)
    data.pop("stop", None)
    if data.pop("algo", algo_name) != algo_name:
        raise SystemExit(f"{config} is not a config for '{algo_name}'")
    algo = get_config_class(algo_name)(**data, seed=seed).build()
    out = {"seed": seed, "solved": False, "seconds_to_solve": None, "env_steps_to_solve": None}
    result: dict = {}
    idle = []
    try:
        while time.time() - spawn_time < max_seconds:
            result = algo.train()
            idle.append(result["learner_idle_fraction"])
            ret = result["episode_return_mean"]
            log(
                algo_name,
                f"seed {seed} it {result['iteration']}: return {ret:.1f}, {result['env_steps_sampled']} sampled, "
                f"{result['env_steps_trained']} trained, idle {result['learner_idle_fraction']:.2f}, "
                f"{time.time() - spawn_time:.1f} s",
            )
            if ret >= TARGET:  # NaN (no episode finished yet) compares False
                out.update(
                    solved=True,
                    seconds_to_solve=time.time() - spawn_time,
                    env_steps_to_solve=result["env_steps_sampled"],
                )
                break
    finally:
        algo.stop()
        runtime.shutdown()
    train_s = result.get("time_total_s") or float("nan")
    out.update(
        iterations=result.get("iteration", 0),
        wall_seconds=time.time() - spawn_time,
        sampled_env_steps_per_s=result.get("env_steps_sampled", 0) / train_s if result else None,
        trained_env_steps_per_s=result.get("env_steps_trained", 0) / train_s if result else None,
        learner_idle_fraction=statistics.fmean(idle) if idle else None,
        dropped_batches=result.get("num_dropped_batches"),
    )
    return out


# ---- parent: one fresh process per seed -----------------------------------------------------
def run_seed(algo_name: str, seed: int, config: str, max_seconds: float) -> dict:
    args = ["--algo", algo_name, "--child", str(seed), "--max-seconds", str(max_seconds), "--config", config]
    return {"seed": seed, **run_child(__file__, args, max_seconds + 120)}


def median(rows: list[dict], key: str):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def main(algo_name: str = "impala") -> None:
    default = REPO / "examples" / f"{algo_name}_cartpole.yaml"
    p = argparse.ArgumentParser(description=f"{algo_name.upper()} on CartPole-v1: seconds and env steps to 450.")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--config", default=str(default.relative_to(REPO)))
    p.add_argument("--max-seconds", type=float, default=120.0, help="per seed, from process start")
    p.add_argument("--algo", default=algo_name, help=argparse.SUPPRESS)
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--spawn-time", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    config = str((REPO / args.config).resolve()) if not Path(args.config).is_absolute() else args.config
    if not Path(config).is_file():
        raise SystemExit(f"config file {args.config} does not exist")

    if args.child is not None:
        print(
            json.dumps(child(args.algo, args.child, config, args.spawn_time or time.time(), args.max_seconds)),
            flush=True,
        )
        return

    per_seed = []
    for seed in range(args.seeds):
        log(args.algo, f"seed {seed}: starting a fresh process (config: {args.config})")
        r = run_seed(args.algo, seed, config, args.max_seconds)
        log(args.algo, f"seed {seed}: {r}")
        per_seed.append(r)
    solved = [r for r in per_seed if r.get("solved")]
    print(
        json.dumps(
            {
                "benchmark": f"{args.algo}_cartpole",
                "solved": len(solved) == len(per_seed),
                "seconds_to_solve": median(solved, "seconds_to_solve"),
                "env_steps_to_solve": median(solved, "env_steps_to_solve"),
                "sampled_env_steps_per_s": median(per_seed, "sampled_env_steps_per_s"),
                "trained_env_steps_per_s": median(per_seed, "trained_env_steps_per_s"),
                "learner_idle_fraction": median(per_seed, "learner_idle_fraction"),
                "seeds": args.seeds,
                "seeds_solved": len(solved),
                "per_seed": per_seed,
                "config": args.config,
            }
        )
    )


if __name__ == "__main__":
    main()
