"""PPO on CartPole-v1: wall seconds, env steps and peak memory to solve, over several seeds.

Each seed runs in a fresh Python process (this script in child mode), so interpreter start
and imports are part of the time. "Solved" means the ``episode_return_mean`` that
``algo.train()`` returns (mean of the last 100 training episodes) first reaches 475.

    python benchmarks/ppo_cartpole.py [--seeds 3] [--config examples/ppo_cartpole.yaml] [--max-seconds 120]

Progress goes to stderr; the last stdout line is one JSON object:
``{"benchmark": "ppo_cartpole", "seeds", "solved", "median_seconds_to_solve",
"median_env_steps_to_solve", "peak_rss_mb", "per_seed", "config"}``. Medians are over the
solved seeds (null when none solved); ``peak_rss_mb`` is the largest child's peak RSS (the
training process only: with ``resources.num_workers > 0`` the Ray workers are not counted).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

from _spawn import run_child

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "examples" / "ppo_cartpole.yaml"
TARGET = 475.0


def log(msg: str) -> None:
    print(f"[ppo_cartpole] {msg}", file=sys.stderr, flush=True)


# ---- child: one seed in this (fresh) process ------------------------------------------------
def child(seed: int, config: str | None, spawn_time: float, max_seconds: float) -> dict:
    import resource

    import torch

    from shoal import runtime
    from shoal.algorithms.ppo import PPO, PPOConfig
    from shoal.config import load_yaml

    torch.set_num_threads(1)
    data = {"env": "CartPole-v1"}
    if config is not None:
        data = load_yaml(config)
        data.pop("stop", None)
        algo_name = data.pop("algo", "ppo")
        if algo_name != "ppo":
            raise SystemExit(f"{config} is a config for '{algo_name}', not ppo")
    data["seed"] = seed
    algo = PPO(PPOConfig(**data))
    out = {
        "seed": seed,
        "solved": False,
        "seconds_to_solve": None,
        "env_steps_to_solve": None,
        "torch_threads": torch.get_num_threads(),
    }
    result: dict = {}
    try:
        while time.time() - spawn_time < max_seconds:
            result = algo.train()
            ret = result["episode_return_mean"]
            log(
                f"seed {seed} it {result['iteration']}: return {ret:.1f}, {result['env_steps_sampled']} steps, "
                f"{time.time() - spawn_time:.1f} s"
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
    final = result.get("episode_return_mean")
    out.update(
        iterations=result.get("iteration", 0),
        env_steps=result.get("env_steps_sampled", 0),
        final_return_mean=None if final is None or math.isnan(final) else final,  # keep the JSON strict
        wall_seconds=time.time() - spawn_time,
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    )  # KB on Linux
    return out


# ---- parent: one fresh process per seed -----------------------------------------------------
def run_seed(seed: int, config: str | None, max_seconds: float) -> dict:
    args = ["--child", str(seed), "--max-seconds", str(max_seconds)] + (
        ["--config", config] if config is not None else []
    )
    return {"seed": seed, **run_child(__file__, args, max_seconds + 120)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--config", default=None, help=f"PPO YAML config (default: {DEFAULT_CONFIG.relative_to(REPO)})")
    p.add_argument("--max-seconds", type=float, default=120.0, help="per seed, from process start")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--spawn-time", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.child is not None:
        print(json.dumps(child(args.child, args.config, args.spawn_time or time.time(), args.max_seconds)), flush=True)
        return

    if args.config is not None:
        config = str(Path(args.config).resolve())
        if not Path(config).is_file():
            raise SystemExit(f"config file {args.config} does not exist")
        config_label = args.config
    elif DEFAULT_CONFIG.is_file():
        config = str(DEFAULT_CONFIG)
        config_label = str(DEFAULT_CONFIG.relative_to(REPO))
    else:
        config = None
        config_label = "PPOConfig defaults (env=CartPole-v1)"
        log(f"{DEFAULT_CONFIG.relative_to(REPO)} not found: using PPOConfig defaults with env=CartPole-v1")

    per_seed = []
    for seed in range(args.seeds):
        log(f"seed {seed}: starting a fresh process (config: {config_label})")
        r = run_seed(seed, config, args.max_seconds)
        log(f"seed {seed}: {r}")
        per_seed.append(r)

    solved = [r for r in per_seed if r.get("solved")]
    rss = [r["peak_rss_mb"] for r in per_seed if r.get("peak_rss_mb") is not None]
    print(
        json.dumps(
            {
                "benchmark": "ppo_cartpole",
                "seeds": args.seeds,
                "solved": len(solved),
                "median_seconds_to_solve": statistics.median(r["seconds_to_solve"] for r in solved) if solved else None,
                "median_env_steps_to_solve": statistics.median(r["env_steps_to_solve"] for r in solved)
                if solved
                else None,
                "peak_rss_mb": max(rss) if rss else None,
                "per_seed": per_seed,
                "config": config_label,
            }
        )
    )


if __name__ == "__main__":
    main()
