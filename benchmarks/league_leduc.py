"""AlphaStar league on Leduc poker for a fixed wall-clock budget, scored by exploitability.

    python benchmarks/league_leduc.py [--budget-s 900] [--config examples/alpha_star_leduc.yaml]
                                      [--every-s 60] [--png curve.png] [--save DIR] [--seed K]
                                      [--seeds N]

Trains the preset until the budget is spent (the last iteration may run over by up to
``min_time_s_per_iteration``). Every ``--every-s`` seconds, and at the end, it computes
exactly (OpenSpiel's best response on the tabular form of each policy): main's
exploitability, and the exploitability of the league's Nash mixture over its frozen players
(the meta-game solved as PSRO does); a Nash equilibrium scores 0, and uniform random play
what the JSON's ``uniform_random_exploitability`` says, computed for the configured game (2.37 in
Leduc, 0.458 in Kuhn poker).
Progress goes to stderr; the last stdout line is one JSON object:

    {"benchmark": "league_leduc", "budget_s": .., "main_exploitability": .., "mixture_exploitability": ..,
     "main_average_exploitability": .. (main's average, with average_policy; else null),
     "best_main_exploitability": .., "players": .., "env_steps": .., "env_steps_per_s": ..,
     "mixture_support": {player: weight, ...}, "curve": [[seconds, env_steps, main, mixture, main_average], ...], ...}

``--seed K`` sets the config's ``seed`` and ``league.seed``. ``--seeds N`` runs seeds 0..N-1 one
after another, each in a fresh process, and prints instead ``{"benchmark": "league_leduc_seeds",
"seeds", "budget_s", "config", "main_exploitability_median", "main_exploitability_range",
"mixture_exploitability_median", "mixture_exploitability_range", the same two for
"main_average_exploitability" (null without average_policy), "uniform_random_exploitability",
"runs": [each seed's JSON object]}``; ``--png`` then draws every seed's main and mixture curves
against minutes of training.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from shoal.algorithms.alpha_star import AlphaStarConfig
from shoal.config import load_yaml

ROOT = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(f"[league_leduc] {msg}", file=sys.stderr, flush=True)


def support(mix) -> dict[str, float]:
    """The mixture's players with weight, heaviest first."""
    order = sorted(zip(mix.policy_ids, mix.weights), key=lambda pw: -pw[1])
    return {p: round(float(w), 3) for p, w in order if w > 1e-6}


def uniform_random_exploitability(cfg: AlphaStarConfig) -> float:
    """Uniform random play's exploitability in the OpenSpiel game ``cfg`` names (``env`` and
    ``env_config``): the figure a league starts from."""
    from shoal.envs.openspiel import PREFIX, OpenSpielEnv
    from shoal.league.exploitability import uniform_exploitability

    if not (isinstance(cfg.env, str) and cfg.env.startswith(PREFIX)):
        raise SystemExit(
            f"league_leduc.py scores OpenSpiel games (env: openspiel:<game>); the config plays {cfg.env!r}"
        )
    return uniform_exploitability(OpenSpielEnv(cfg.env[len(PREFIX) :], **cfg.env_config).game)


def draw(curve: list, path: Path) -> None:
    """The curve as ``shoal league`` draws a run's (main and the mixture against env steps)."""
    from shoal.league.report import exploitability_figure

    fig = exploitability_figure(
        [{"env_steps": c[1], "main": c[2], "mixture": c[3], "main_average": c[4]} for c in curve]
    )
    if fig is not None:
        fig.savefig(path, dpi=100)
        log(f"curve: {path}")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget-s", type=float, default=900.0)
    p.add_argument("--config", type=Path, default=ROOT / "examples" / "alpha_star_leduc.yaml")
    p.add_argument("--every-s", type=float, default=60.0, help="seconds between exploitability measurements")
    p.add_argument("--png", type=Path, default=None, help="also draw the curve(s) into this PNG")
    p.add_argument(
        "--save",
        type=Path,
        default=None,
        help="also save the league at the end as a checkpoint in this directory (shoal league, load_policy)",
    )
    p.add_argument("--seed", type=int, default=None, help="the config's seed and league.seed (default: the config's)")
    p.add_argument("--seeds", type=int, default=1, help="run seeds 0..N-1, each in a fresh process; median and range")
    args = p.parse_args()
    if args.seeds < 1:
        p.error(f"--seeds must be at least 1; got {args.seeds}")
    if args.seeds > 1 and (args.seed is not None or args.save is not None):
        p.error("--seeds runs seeds 0..N-1 itself; give --seed or --save only for one run")
    return args


def config_for(args: argparse.Namespace) -> AlphaStarConfig:
    data = load_yaml(args.config)
    data.pop("algo", None)
    data.pop("stop", None)
    if args.seed is not None:
        data["seed"] = args.seed
        data.setdefault("league", {})["seed"] = args.seed
    return AlphaStarConfig(**data)


def run_seeds(args: argparse.Namespace) -> dict:
    """Seeds 0..N-1, one fresh process each (this script with ``--seed``), and their summary."""
    runs = []
    for seed in range(args.seeds):
        cmd = [sys.executable, __file__, "--budget-s", str(args.budget_s), "--config", str(args.config)]
        cmd += ["--every-s", str(args.every_s), "--seed", str(seed)]
        log(f"seed {seed} of {args.seeds}")
        out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False).stdout
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        runs.append({"seed": seed, **json.loads(lines[-1])} if lines else {"seed": seed, "error": "no result"})
    done = [r for r in runs if "error" not in r]
    summary: dict = {"benchmark": "league_leduc_seeds", "seeds": args.seeds, "budget_s": args.budget_s}
    summary["config"] = args.config.name
    for key in ("main_exploitability", "main_average_exploitability", "mixture_exploitability"):
        values = [r[key] for r in done if r.get(key) is not None]
        summary[f"{key}_median"] = statistics.median(values) if values else None
        summary[f"{key}_range"] = [min(values), max(values)] if values else None
    summary["uniform_random_exploitability"] = done[0]["uniform_random_exploitability"] if done else None
    summary["runs"] = runs
    return summary


def draw_seeds(runs: list[dict], path: Path) -> None:
    """Every seed's main (solid) and mixture (dashed) exploitability against minutes of training."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in runs:
        if "curve" not in r:
            continue
        minutes = [c[0] / 60 for c in r["curve"]]
        (line,) = ax.plot(minutes, [c[2] for c in r["curve"]], label=f"main, seed {r['seed']}")
        ax.plot(minutes, [c[3] for c in r["curve"]], "--", color=line.get_color(), label=f"mixture, seed {r['seed']}")
        if any(len(c) > 4 and c[4] is not None for c in r["curve"]):
            ax.plot(
                minutes,
                [c[4] for c in r["curve"]],
                ":",
                color=line.get_color(),
                label=f"main@average, seed {r['seed']}",
            )
    ax.set_xlabel("minutes of training")
    ax.set_ylabel("exploitability")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    log(f"curves: {path}")


def main() -> None:
    args = parse_args()
    if args.seeds > 1:
        summary = run_seeds(args)
        if args.png is not None:
            draw_seeds(summary["runs"], args.png)
        print(json.dumps(summary))
        return
    run_one(args)


def average_x(algo) -> float | None:
    """Main's average's exploitability (``average_policy``); None when the run keeps none."""
    if algo.config.average_policy is None:
        return None
    return round(algo.exploitability("main@average"), 4)


def run_one(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    cfg = config_for(args)
    uniform = uniform_random_exploitability(cfg)
    log(f"budget {args.budget_s:.0f} s, config {args.config.name}, env {cfg.env} (uniform random play: {uniform:.4g})")
    t0 = time.perf_counter()
    curve, r, next_at = [], {}, 0.0
    eval_s = 0.0  # time spent measuring, left out of the training budget
    with cfg.build() as algo:
        while time.perf_counter() - t0 - eval_s < args.budget_s:
            r = algo.train()
            if time.perf_counter() - t0 - eval_s >= next_at:
                e0 = time.perf_counter()
                main_x, mix, avg_x = algo.exploitability("main"), algo.league_mixture(), average_x(algo)
                eval_s += time.perf_counter() - e0
                curve.append(
                    [
                        round(time.perf_counter() - t0 - eval_s, 1),
                        int(r["env_steps_sampled"]),
                        round(main_x, 4),
                        round(mix.exploitability, 4),
                        avg_x,
                    ]
                )
                log(
                    f"{curve[-1][0]:6.0f} s  iter {r['iteration']:4d}  env steps {r['env_steps_sampled']:9d}  "
                    f"players {r['num_policies']:2d}  main {main_x:.3f}  mixture {mix.exploitability:.3f} "
                    f"(support {int((mix.weights > 1e-6).sum())} of {len(mix.policy_ids)})  "
                    f"entropy {r.get('learner/main/entropy', float('nan')):.3f}  "
                    + ("" if avg_x is None else f"main@average {avg_x:.3f}  ")
                    + f"weights {support(mix)}"
                )
                next_at += args.every_s
        train_s = time.perf_counter() - t0 - eval_s
        main_x, mix, avg_x = algo.exploitability("main"), algo.league_mixture(), average_x(algo)
        curve.append(
            [
                round(train_s, 1),
                int(r.get("env_steps_sampled", 0)),
                round(main_x, 4),
                round(mix.exploitability, 4),
                avg_x,
            ]
        )
        players = len(algo.league.players)
        if args.save is not None:
            log(f"checkpoint: {algo.save(args.save)}")
    log(
        f"main {main_x:.3f}, "
        + ("" if avg_x is None else f"main@average {avg_x:.3f}, ")
        + f"mixture {mix.exploitability:.3f} over {len(mix.policy_ids)} frozen players: {support(mix)}"
    )
    if args.png is not None:
        draw(curve, args.png)
    steps = int(r.get("env_steps_sampled", 0))
    print(
        json.dumps(
            {
                "benchmark": "league_leduc",
                "budget_s": args.budget_s,
                "seed": cfg.seed,
                "config": args.config.name,
                "main_exploitability": round(main_x, 4),
                "mixture_exploitability": round(mix.exploitability, 4),
                "main_average_exploitability": avg_x,
                "best_main_exploitability": min(c[2] for c in curve),
                "best_mixture_exploitability": min(c[3] for c in curve),
                "players": players,
                "env_steps": steps,
                "env_steps_per_s": round(steps / max(train_s, 1e-9), 1),
                "uniform_random_exploitability": round(uniform, 4),
                "mixture_support": support(mix),
                "curve": curve,
            }
        )
    )


if __name__ == "__main__":
    main()
