"""SAC on Pendulum-v1: seconds from process start until the mean return of the last 20 episodes
reaches -200, shoal beside Stable-Baselines3's SAC on SB3's settings (the like-for-like row), and
shoal's own tuned preset as a separate, labelled row.

Rows (``--only``, all by default):

- ``sb3``: ``SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3)``, the RL Zoo's ``sac.yml``
  entry for Pendulum-v1; everything else SB3's defaults: [256, 256] networks, batch 256, one
  gradient step per env step, 100 random steps first, buffer 1,000,000, tau 0.005, gamma 0.99,
  the entropy temperature tuned from 1.0 towards -1.
- ``shoal``: ``benchmarks/configs/sac_pendulum_sb3.yaml`` (``--config``), the same settings
  key for key, one env in the process: the like-for-like row.
- ``shoal_preset``: ``examples/sac_pendulum.yaml`` (``--preset``), shoal's tuned preset
  ([64, 64] networks): not like for like, reported as its own row.

Every row counts every episode (one env each), and checks the target after every episode (an
SB3 callback after every step, which sees the mean change only when an episode ends; shoal after
every iteration of one 200-step episode). Each run is a fresh Python process (this script in
child mode), so interpreter start, imports and set-up count; one torch thread each
(``--threads``). A run stops at the target or at ``--max-seconds``.

    python benchmarks/sac_pendulum.py [--seeds 3] [--max-seconds 180] [--only shoal,sb3,shoal_preset]
                                      [--config F] [--preset F]

Progress goes to stderr; the last stdout line is one JSON object: ``benchmark``, ``target``,
``window``, ``threads``, ``config``, ``preset``, per row ``<row>_median_seconds``,
``<row>_seconds_range``, ``<row>_median_env_steps``, ``<row>_median_ms_per_env_step`` (seconds
from process start over env steps), ``<row>_solved`` (medians and ranges over solved seeds, null
when none), ``speedup_like_for_like`` (SB3's median seconds over shoal's),
``env_steps_ratio_like_for_like`` (shoal's median env steps over SB3's), ``speedup_preset``
(SB3's over the preset's: different settings) and ``runs``.
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
CONFIG = REPO / "benchmarks" / "configs" / "sac_pendulum_sb3.yaml"
PRESET = REPO / "examples" / "sac_pendulum.yaml"
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


def summarize(name: str, args, runs: dict[str, list[dict]]) -> dict:
    """The summary JSON object of ``runs`` (each row's seeds) for :func:`compare`."""
    out: dict = {"benchmark": name, "target": TARGET, "window": WINDOW, "threads": args.threads}
    out["config"], out["preset"] = repo_relative(args.config), repo_relative(args.preset)
    for row, rs in runs.items():
        seconds = [r["seconds"] for r in rs if r.get("solved")]
        out[f"{row}_median_seconds"] = median_of(rs, "seconds")
        out[f"{row}_seconds_range"] = [min(seconds), max(seconds)] if seconds else None
        out[f"{row}_median_env_steps"] = median_of(rs, "env_steps")
        per_step = [1000 * r["seconds"] / r["env_steps"] for r in rs if r.get("solved")]
        out[f"{row}_median_ms_per_env_step"] = statistics.median(per_step) if per_step else None
        out[f"{row}_solved"] = len(seconds)
    sb3 = out.get("sb3_median_seconds")
    for row, key in (("shoal", "like_for_like"), ("shoal_preset", "preset")):
        mine = out.get(f"{row}_median_seconds")
        out[f"speedup_{key}"] = sb3 / mine if sb3 and mine else None
    steps, sb3_steps = out.get("shoal_median_env_steps"), out.get("sb3_median_env_steps")
    out["env_steps_ratio_like_for_like"] = steps / sb3_steps if steps and sb3_steps else None
    out["runs"] = runs
    return out


def repo_relative(path: str) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(REPO)) if p.is_relative_to(REPO) else path


def compare(name: str, doc: str, children: dict, config: Path, preset: Path, script: str) -> None:
    """The benchmark's command line: in child mode one run of ``children[row]`` (the shoal rows take
    ``--config`` or ``--preset``); otherwise the seeds of each row, alternated, and the summary JSON
    line (``name`` in its ``benchmark``)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--max-seconds", type=float, default=180.0)
    p.add_argument("--threads", type=int, default=1, help="torch threads in each run")
    p.add_argument("--only", default=",".join(children), help="comma-separated: " + ", ".join(children))
    p.add_argument("--config", default=str(config), help="the like-for-like shoal row's config file")
    p.add_argument("--preset", default=str(preset), help="the shoal_preset row's config file")
    p.add_argument("--child", choices=list(children), help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--spawn-time", type=float, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        fn = children[args.child]
        file = args.preset if args.child == "shoal_preset" else args.config
        print(json.dumps(fn(args.seed, args.spawn_time, args.max_seconds, args.threads, file)), flush=True)
        return
    rows = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = sorted(set(rows) - set(children))
    if unknown:
        p.error(f"--only: unknown row(s) {', '.join(unknown)}; choose from {', '.join(children)}")
    runs: dict[str, list[dict]] = {row: [] for row in rows}
    for seed in range(args.seeds):
        for row in rows:  # alternate, so drift in machine load touches every row alike
            child_args = ["--child", row, "--seed", str(seed), "--max-seconds", str(args.max_seconds)]
            child_args += ["--config", args.config, "--preset", args.preset, "--threads", str(args.threads)]
            r = run_child(script, child_args, args.max_seconds + 120)
            r["row"] = row
            r.setdefault("seed", seed)
            runs[row].append(r)
            print(f"[{name}] {json.dumps(r)}", file=sys.stderr, flush=True)
    print(json.dumps(summarize(name, args, runs)))


def main() -> None:
    children = {"shoal": child_shoal, "sb3": child_sb3, "shoal_preset": child_shoal}
    compare("sac_pendulum", __doc__, children, CONFIG, PRESET, __file__)


if __name__ == "__main__":
    main()
