"""Ape-X on CartPole-v1: wall seconds and env steps to a mean return of 450, throughput, learner busy time.

The run happens in a fresh Python process (this script in child mode), so interpreter start,
imports, Ray start-up and the creation of the rollout actors and replay shards count.
"Solved" means the ``episode_return_mean`` that ``algo.train()`` returns (the last-100 mean
over the reporting, lowest-epsilon, rollout actors) first reaches 450.

    python benchmarks/apex_cartpole.py [--budget-s 120] [--seed 0] [--config examples/apex_cartpole.yaml]

Without ``--config`` the config is ``ApeXConfig.small_machine_preset()`` (what ``shoal train
apex`` uses) with iterations of about 1 s. Progress goes to stderr; the last stdout line is one
JSON object: ``{"benchmark": "apex_cartpole", "solved", "seconds_to_solve",
"env_steps_to_solve", "sampled_env_steps_per_s", "trained_env_steps_per_s",
"learner_busy_fraction", "replay_ratio", ...}`` (``replay_ratio``: env steps trained per env step
sampled since learning started, at the end). The throughputs and the busy fraction cover the iterations
after learning started (the first iteration that began with ``learning_starts`` steps
sampled) up to the solve or the budget: steps over those iterations' summed time, and the
mean of their ``learner_busy_fraction``.
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


def log(msg: str) -> None:
    print(f"[apex_cartpole] {msg}", file=sys.stderr, flush=True)


def build_config(seed: int, config: str | None):
    from shoal.algorithms.apex import ApeXConfig
    from shoal.config import load_yaml

    if config is None:
        data = {**ApeXConfig.small_machine_preset(), "env": "CartPole-v1", "min_time_s_per_iteration": 1.0}
    else:
        data = load_yaml(config)
        data.pop("stop", None)
        if data.pop("algo", "apex") != "apex":
            raise SystemExit(f"{config} is not an Ape-X config")
    return ApeXConfig(**{**data, "seed": seed})


# ---- child: the run, in this (fresh) process ------------------------------------------------
def child(seed: int, config: str | None, spawn_time: float, budget_s: float) -> dict:
    import torch

    from shoal import runtime

    torch.set_num_threads(1)
    cfg = build_config(seed, config)
    algo = cfg.build()
    setup_s = time.time() - spawn_time
    log(f"built in {setup_s:.1f} s from process start")
    out = {
        "seed": seed,
        "solved": False,
        "seconds_to_solve": None,
        "env_steps_to_solve": None,
        "setup_seconds": round(setup_s, 2),
    }
    result: dict = {}
    learning = {"time_s": 0.0, "sampled": 0, "trained": 0, "updates": 0, "busy": []}
    try:
        while time.time() - spawn_time < budget_s:
            before = (
                result.get("env_steps_sampled", 0),
                result.get("env_steps_trained", 0),
                result.get("num_learner_updates", 0),
            )
            result = algo.train()
            if before[0] >= cfg.learning_starts:  # this whole iteration ran with learning on
                learning["time_s"] += result["time_this_iter_s"]
                learning["sampled"] += result["env_steps_sampled"] - before[0]
                learning["trained"] += result["env_steps_trained"] - before[1]
                learning["updates"] += result["num_learner_updates"] - before[2]
                learning["busy"].append(result["learner_busy_fraction"])
            ret = result["episode_return_mean"]
            log(
                f"it {result['iteration']}: return {ret:.1f}, {result['env_steps_sampled']} sampled, "
                f"{result['env_steps_trained']} trained, busy {result['learner_busy_fraction']:.2f}, "
                f"dropped {result['num_replay_batches_dropped']}, {time.time() - spawn_time:.1f} s"
            )
            if ret >= TARGET:  # NaN (no episode finished yet) compares False
                out.update(
                    solved=True,
                    seconds_to_solve=round(time.time() - spawn_time, 2),
                    env_steps_to_solve=result["env_steps_sampled"],
                )
                break
    finally:
        algo.stop()
        runtime.shutdown()
    t = learning["time_s"]
    out.update(
        sampled_env_steps_per_s=round(learning["sampled"] / t, 1) if t else None,
        trained_env_steps_per_s=round(learning["trained"] / t, 1) if t else None,
        learner_busy_fraction=round(statistics.fmean(learning["busy"]), 3) if learning["busy"] else None,
        learner_updates_per_s=round(learning["updates"] / t, 2) if t else None,
        iterations=result.get("iteration", 0),
        learning_iterations=len(learning["busy"]),
        wall_seconds=round(time.time() - spawn_time, 2),
        replay_ratio=round(result["replay_ratio"], 3) if "replay_ratio" in result else None,
        num_replay_batches_dropped=result.get("num_replay_batches_dropped"),
        num_worker_restarts=result.get("num_worker_restarts"),
        num_replay_shard_restarts=result.get("num_replay_shard_restarts"),
    )
    return out


# ---- parent: spawn the child, print its figures ---------------------------------------------
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget-s", type=float, default=120.0, help="wall seconds from process start")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--config", default=None, help="Ape-X YAML config (default: the small-machine preset)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--spawn-time", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    config = None
    if args.config is not None:
        config = str((REPO / args.config).resolve()) if not Path(args.config).is_absolute() else args.config
        if not Path(config).is_file():
            raise SystemExit(f"config file {args.config} does not exist")

    if args.child:
        print(json.dumps(child(args.seed, config, args.spawn_time or time.time(), args.budget_s)), flush=True)
        return

    log(f"seed {args.seed}: starting a fresh process ({args.config or 'small-machine preset'})")
    run = run_child(
        __file__,
        ["--child", "--seed", str(args.seed), "--budget-s", str(args.budget_s)]
        + (["--config", config] if config else []),
        args.budget_s + 120,
    )
    keys = (
        "solved",
        "seconds_to_solve",
        "env_steps_to_solve",
        "sampled_env_steps_per_s",
        "trained_env_steps_per_s",
        "learner_busy_fraction",
    )
    print(
        json.dumps(
            {
                "benchmark": "apex_cartpole",
                **{k: run.get(k) for k in keys},
                **{k: v for k, v in run.items() if k not in keys},
                "budget_s": args.budget_s,
                "config": args.config or "small_machine_preset",
            }
        )
    )


if __name__ == "__main__":
    main()
