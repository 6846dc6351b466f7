"""SAC on Pendulum-v1: seconds from process start until the mean return of the last 20 episodes
reaches -200, for shoal's preset and for Stable-Baselines3's SAC with the RL Zoo's settings.

Each run is a fresh Python process (this script in child mode), so interpreter start, imports
and set-up count. shoal trains ``examples/sac_pendulum.yaml`` (in-process, one env); SB3 trains
``SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3)`` (the RL Zoo's ``sac.yml`` entry for
Pendulum-v1: everything else SB3's defaults, i.e. [256, 256] networks, batch 256, one gradient
step per env step, 100 random steps first, tau 0.005, entropy tuned towards -1). Both use one
torch thread (``--threads``), as shoal does by default. A run stops at the target or at
``--max-seconds``.

    python benchmarks/sac_pendulum.py [--seeds 3] [--max-seconds 180] [--only shoal,sb3] [--config F]

Progress goes to stderr; the last stdout line is one JSON object: ``{"benchmark":
"sac_pendulum", "target", "shoal_median_seconds", "shoal_median_env_steps", "shoal_solved",
"sb3_median_seconds", "sb3_median_env_steps", "sb3_solved", "speedup", "runs"}``; medians are
over solved seeds (null when none), ``speedup`` is SB3's median seconds over shoal's.
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
CONFIG = REPO / "examples" / "sac_pendulum.yaml"
TARGET = -200.0
WINDOW = 20


def last_mean(returns) -> float | None:
    returns = list(returns)
    return sum(returns[-WINDOW:]) / WINDOW if len(returns) >= WINDOW else None


# ---- children: one run in this (fresh) process ----------------------------------------------
def train_shoal(config_cls, seed: int, spawn_time: float, max_seconds: float, threads: int, config: str) -> dict:
    """One shoal run of ``config`` (a preset file) until the target, the time limit or the end."""
    import torch

    from shoal.config import load_yaml

    torch.set_num_threads(threads)
    data = load_yaml(config)
    data.pop("stop", None)
    data.pop("algo", None)
    data["seed"] = seed
    data.setdefault("resources", {})["torch_threads"] = threads
    algo = config_cls(**data).build()
    out = {"lib": "shoal", "seed": seed, "solved": False, "seconds": None, "env_steps": None}
    try:
        while time.time() - spawn_time < max_seconds:
            r = algo.train()
            mean = last_mean(algo.episodes.returns)
            out.update(final_mean_20=mean, env_steps_total=r["env_steps_sampled"])
            if mean is not None and mean >= TARGET:
                out.update(solved=True, seconds=time.time() - spawn_time, env_steps=r["env_steps_sampled"])
                break
    finally:
        algo.stop()
    return out


def sb3_until_target(out: dict, spawn_time: float, max_seconds: float):
    """An SB3 callback that records the 20-episode mean in ``out`` and stops at the target or the time limit."""
    from stable_baselines3.common.callbacks import BaseCallback

    class UntilTarget(BaseCallback):
        def _on_step(self) -> bool:
            mean = last_mean(ep["r"] for ep in self.model.ep_info_buffer)
            out.update(final_mean_20=mean, env_steps_total=self.num_timesteps)
            if mean is not None and mean >= TARGET:
                out.update(solved=True, seconds=time.time() - spawn_time, env_steps=self.num_timesteps)
                return False
            return time.time() - spawn_time < max_seconds

    return UntilTarget()


def child_shoal(seed: int, spawn_time: float, max_seconds: float, threads: int, config: str) -> dict:
    from shoal.algorithms.sac import SACConfig

    return train_shoal(SACConfig, seed, spawn_time, max_seconds, threads, config)


def child_sb3(seed: int, spawn_time: float, max_seconds: float, threads: int, config: str) -> dict:
    import torch
    from stable_baselines3 import SAC

    torch.set_num_threads(threads)
    out = {"lib": "sb3", "seed": seed, "solved": False, "seconds": None, "env_steps": None}
    model = SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3, seed=seed, device="cpu", verbose=0)
    model.learn(total_timesteps=10**7, callback=sb3_until_target(out, spawn_time, max_seconds))
    return out


# ---- parent ---------------------------------------------------------------------------------
def median_of(runs: list[dict], key: str):
    vals = [r[key] for r in runs if r.get("solved")]
    return statistics.median(vals) if vals else None


def compare(name: str, doc: str, children: dict, default_config: Path, script: str) -> None:
    """The benchmark's command line: in child mode one run of ``children[lib]``; otherwise the
    seeds of each library, alternated, and the summary JSON line (``name`` in its ``benchmark``)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--max-seconds", type=float, default=180.0)
    p.add_argument("--threads", type=int, default=1, help="torch threads in each run")
    p.add_argument("--only", default=",".join(children), help="comma-separated: " + ", ".join(children))
    p.add_argument("--config", default=str(default_config), help="shoal's config file")
    p.add_argument("--child", choices=list(children), help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--spawn-time", type=float, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        fn = children[args.child]
        print(json.dumps(fn(args.seed, args.spawn_time, args.max_seconds, args.threads, args.config)), flush=True)
        return
    libs = [x.strip() for x in args.only.split(",") if x.strip()]
    runs: dict[str, list[dict]] = {lib: [] for lib in libs}
    for seed in range(args.seeds):
        for lib in libs:  # alternate, so drift in machine load touches both alike
            child_args = [
                "--child",
                lib,
                "--seed",
                str(seed),
                "--max-seconds",
                str(args.max_seconds),
                "--config",
                args.config,
            ]
            r = run_child(script, [*child_args, "--threads", str(args.threads)], args.max_seconds + 120)
            r.setdefault("lib", lib)
            r.setdefault("seed", seed)
            runs[lib].append(r)
            print(f"[{name}] {json.dumps(r)}", file=sys.stderr, flush=True)
    out: dict = {"benchmark": name, "target": TARGET, "window": WINDOW, "threads": args.threads}
    out["config"] = (
        str(Path(args.config).resolve().relative_to(REPO))
        if Path(args.config).resolve().is_relative_to(REPO)
        else args.config
    )
    for lib in libs:
        out[f"{lib}_median_seconds"] = median_of(runs[lib], "seconds")
        out[f"{lib}_median_env_steps"] = median_of(runs[lib], "env_steps")
        out[f"{lib}_solved"] = sum(bool(r.get("solved")) for r in runs[lib])
    if out.get("shoal_median_seconds") and out.get("sb3_median_seconds"):
        out["speedup"] = out["sb3_median_seconds"] / out["shoal_median_seconds"]
    out["runs"] = runs
    print(json.dumps(out))


def main() -> None:
    compare("sac_pendulum", __doc__, {"shoal": child_shoal, "sb3": child_sb3}, CONFIG, __file__)


if __name__ == "__main__":
    main()
