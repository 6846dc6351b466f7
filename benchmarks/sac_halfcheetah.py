"""SAC on MuJoCo's HalfCheetah-v5: seconds and env steps until the mean return of the last 10
episodes first reaches 3,000, within a wall-clock budget, shoal beside Stable-Baselines3 on the
same settings.

    python benchmarks/sac_halfcheetah.py [--budget-s 1800] [--config examples/sac_halfcheetah.yaml]
                                         [--only shoal,sb3] [--threads 2] [--target 3000]
                                         [--out-dir benchmarks/results]

Needs MuJoCo (``pip install -e '.[mujoco]'``). Rows (``--only``, both by default), one after
the other, each in a fresh Python process (start-up counts), episodes of 1,000 steps:

- ``shoal``: the preset (``--config``; ``examples/sac_halfcheetah.yaml`` is the RL Zoo's
  HalfCheetah entry: SB3's SAC defaults, lr 3e-4, [256, 256], batch 256, one update per env
  step, tau 0.005, 10,000 random steps first), one env in the process.
- ``sb3``: ``SAC("MlpPolicy", "HalfCheetah-v5", learning_starts=10000)``, the same settings.

Both use ``--threads`` torch threads (2 by default, the preset's: the learner is the cost).
Progress goes to stderr; the last stdout line is one JSON object: ``benchmark``, ``env``,
``budget_s``, ``target``, ``threads``, per row (``shoal``, ``sb3``) ``reached``,
``seconds_to_target`` and ``env_steps_to_target`` (null if not reached), ``best_mean_10``,
``final_mean_10``, ``env_steps``, ``env_steps_per_s``, ``curve`` (``[seconds, env steps, mean
of the last 10 episodes]``, each iteration for shoal, every 5,000 steps for SB3);
``speedup_like_for_like`` (SB3's seconds to the target over shoal's, when both reached it),
``env_steps_ratio_like_for_like`` and ``png`` (the curves, written beside the JSON in
``--out-dir``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from _spawn import run_child

REPO = Path(__file__).resolve().parent.parent
WINDOW = 10


def log(msg: str) -> None:
    print(f"[sac_halfcheetah] {msg}", file=sys.stderr, flush=True)


def child(config_path: str, budget_s: float, spawn_time: float, target: float, threads: int) -> dict:
    from shoal.algorithms.sac import SACConfig
    from shoal.config import load_yaml

    data = load_yaml(config_path)
    data.pop("stop", None)
    data.pop("algo", None)
    data.setdefault("resources", {})["torch_threads"] = threads
    algo = SACConfig(**data, seed=0).build()
    out: dict = {"env": algo.config.env, "budget_s": budget_s, "target": target, "reached": False}
    out.update(seconds_to_target=None, env_steps_to_target=None)
    curve, best, mean, r, updates = [], float("-inf"), None, {}, 0
    try:
        while time.time() - spawn_time < budget_s:
            r = algo.train()
            updates = algo.learner.num_updates
            returns = list(algo.episodes.returns)[-WINDOW:]
            mean = sum(returns) / len(returns) if len(returns) == WINDOW else None
            seconds = time.time() - spawn_time
            curve.append([round(seconds, 1), r["env_steps_sampled"], mean])
            if mean is not None:
                best = max(best, mean)
                log(f"{seconds:.0f} s, {r['env_steps_sampled']} steps, mean of last {WINDOW}: {mean:.1f}")
                if mean >= target and not out["reached"]:
                    out.update(reached=True, seconds_to_target=seconds, env_steps_to_target=r["env_steps_sampled"])
                    break
    finally:
        algo.stop()
    elapsed = time.time() - spawn_time
    out.update(
        best_mean_10=None if best == float("-inf") else best,
        final_mean_10=mean,
        env_steps=r.get("env_steps_sampled"),
        env_steps_per_s=(r.get("env_steps_sampled") or 0) / elapsed,
        updates_per_s=updates / elapsed,
        curve=curve,
    )
    return out


def child_sb3(budget_s: float, spawn_time: float, target: float, threads: int) -> dict:
    """SB3's SAC with the RL Zoo's HalfCheetah settings until the target or the budget."""
    import torch
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(threads)
    out: dict = {"env": "HalfCheetah-v5", "budget_s": budget_s, "target": target, "reached": False}
    out.update(seconds_to_target=None, env_steps_to_target=None, curve=[], best_mean_10=None, final_mean_10=None)

    class UntilTarget(BaseCallback):
        def _on_step(self) -> bool:
            returns = [ep["r"] for ep in self.model.ep_info_buffer][-WINDOW:]
            mean = sum(returns) / WINDOW if len(returns) == WINDOW else None
            seconds = time.time() - spawn_time
            if self.num_timesteps % 5000 == 0:
                out["curve"].append([round(seconds, 1), self.num_timesteps, mean])
                log(f"sb3 {seconds:.0f} s, {self.num_timesteps} steps, mean of last {WINDOW}: {mean}")
            if mean is not None:
                out["final_mean_10"] = mean
                out["best_mean_10"] = max(mean, out["best_mean_10"] or mean)
                if mean >= target:
                    out.update(reached=True, seconds_to_target=seconds, env_steps_to_target=self.num_timesteps)
                    return False
            return seconds < budget_s

    model = SAC("MlpPolicy", "HalfCheetah-v5", learning_starts=10_000, seed=0, device="cpu", verbose=0)
    model.learn(total_timesteps=10**7, callback=UntilTarget())
    elapsed = time.time() - spawn_time
    out.update(env_steps=model.num_timesteps, env_steps_per_s=model.num_timesteps / elapsed)
    return out


def plot(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for row in ("shoal", "sb3"):
        pts = [(s, n, m) for s, n, m in (result.get(row) or {}).get("curve", []) if m is not None]
        ax.plot([s / 60 for s, _, _ in pts], [m for _, _, m in pts], label=row)
    ax.axhline(result["target"], color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("minutes from process start")
    ax.set_ylabel(f"mean return, last {WINDOW} episodes")
    ax.set_title(f"SAC, {result['env']} ({result['threads']} torch threads)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget-s", type=float, default=1800.0)
    p.add_argument("--config", default=str(REPO / "examples" / "sac_halfcheetah.yaml"))
    p.add_argument("--only", default="shoal,sb3", help="comma-separated rows: shoal, sb3")
    p.add_argument("--threads", type=int, default=2, help="torch threads in each run")
    p.add_argument("--target", type=float, default=3000.0)
    p.add_argument("--out-dir", default=str(REPO / "benchmarks" / "results"))
    p.add_argument("--child", choices=["shoal", "sb3"], help=argparse.SUPPRESS)
    p.add_argument("--spawn-time", type=float, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child == "sb3":
        print(json.dumps(child_sb3(args.budget_s, args.spawn_time, args.target, args.threads)), flush=True)
        return
    if args.child == "shoal":
        print(json.dumps(child(args.config, args.budget_s, args.spawn_time, args.target, args.threads)), flush=True)
        return
    rows = [x.strip() for x in args.only.split(",") if x.strip()]
    if not rows or set(rows) - {"shoal", "sb3"}:
        p.error(f"--only takes shoal and/or sb3; got {args.only!r}")
    result: dict = {"benchmark": "sac_halfcheetah", "env": "HalfCheetah-v5", "budget_s": args.budget_s}
    result.update(target=args.target, threads=args.threads, config=args.config)
    for row in rows:
        child_args = ["--child", row, "--budget-s", str(args.budget_s), "--config", args.config]
        child_args += ["--target", str(args.target), "--threads", str(args.threads)]
        result[row] = run_child(__file__, child_args, args.budget_s + 600)
        log(f"{row}: reached {result[row].get('reached')}, seconds {result[row].get('seconds_to_target')}")
    shoal, sb3 = result.get("shoal") or {}, result.get("sb3") or {}
    both = shoal.get("reached") and sb3.get("reached")
    result["speedup_like_for_like"] = sb3["seconds_to_target"] / shoal["seconds_to_target"] if both else None
    ratio = shoal["env_steps_to_target"] / sb3["env_steps_to_target"] if both else None
    result["env_steps_ratio_like_for_like"] = ratio
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "sac_halfcheetah.json").write_text(json.dumps(result))
    result["png"] = str(out_dir / "sac_halfcheetah.png")
    plot(result, Path(result["png"]))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
