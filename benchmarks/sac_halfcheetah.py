"""SAC on MuJoCo's HalfCheetah-v5: seconds and env steps until the mean return of the last 10
episodes first reaches 3,000, within a wall-clock budget.

    python benchmarks/sac_halfcheetah.py [--budget-s 1800] [--config examples/sac_halfcheetah.yaml]
                                         [--target 3000] [--out-dir benchmarks/results]

Needs MuJoCo (``pip install -e '.[mujoco]'``). Trains in a fresh Python process (start-up
counts) from the preset; episodes are 1,000 steps. Progress goes to stderr; the last stdout line
is one JSON object: ``env``, ``budget_s``, ``target``, ``reached``, ``seconds_to_target`` and
``env_steps_to_target`` (null if not reached), ``best_mean_10``, ``final_mean_10``,
``env_steps``, ``env_steps_per_s``, ``updates_per_s``, ``curve`` (``[seconds, env steps, mean of
the last 10 episodes]`` after each iteration) and ``png`` (the curve, written beside the JSON
in ``--out-dir``).
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


def child(config_path: str, budget_s: float, spawn_time: float, target: float) -> dict:
    from shoal.algorithms.sac import SACConfig
    from shoal.config import load_yaml

    data = load_yaml(config_path)  # resources.torch_threads sets the threads (the preset: both cores)
    data.pop("stop", None)
    data.pop("algo", None)
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


def plot(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(s, n, m) for s, n, m in result["curve"] if m is not None]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([n / 1e3 for _, n, _ in pts], [m for _, _, m in pts])
    ax.axhline(result["target"], color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("env steps (thousands)")
    ax.set_ylabel(f"mean return, last {WINDOW} episodes")
    ax.set_title(f"SAC, {result['env']} (2 cores)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget-s", type=float, default=1800.0)
    p.add_argument("--config", default=str(REPO / "examples" / "sac_halfcheetah.yaml"))
    p.add_argument("--target", type=float, default=3000.0)
    p.add_argument("--out-dir", default=str(REPO / "benchmarks" / "results"))
    p.add_argument("--spawn-time", type=float, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.spawn_time is not None:
        print(json.dumps(child(args.config, args.budget_s, args.spawn_time, args.target)), flush=True)
        return
    child_args = ["--budget-s", str(args.budget_s), "--config", args.config, "--target", str(args.target)]
    result = run_child(__file__, child_args, args.budget_s + 600)
    result = {"benchmark": "sac_halfcheetah", **result}
    if result.get("curve"):
        out_dir = Path(args.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "sac_halfcheetah.json").write_text(json.dumps(result))
        result["png"] = str(out_dir / "sac_halfcheetah.png")
        plot(result, Path(result["png"]))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
