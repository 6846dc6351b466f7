"""AlphaStar league on connect four for a fixed wall-clock budget: throughput, league size, strength.

    python benchmarks/league_connect4.py [--budget-s 900] [--config examples/alpha_star_connect4.yaml]
                                         [--workers N] [--games 200]

Trains ``examples/alpha_star_connect4.yaml`` until the budget is spent (the last iteration
may run over by up to ``min_time_s_per_iteration``), then plays the main policy greedily
against a uniformly random player, the one-step-lookahead heuristic (win if it can, block if
it must, else random) and the two-step one (as the one-step, but never a move that lets the
opponent win on its reply), ``--games`` each, half of them as first player.
Progress lines go to stdout; the last line is one JSON object:

    {"benchmark": "league_connect4", "budget_s": .., "env_steps_per_s": .., "players": ..,
     "win_rate_vs_random": .., "win_rate_vs_heuristic": .., "win_rate_vs_heuristic2": .., ...}
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import yaml

from shoal.algorithms.alpha_star import AlphaStarConfig

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget-s", type=float, default=900.0)
    p.add_argument("--config", type=Path, default=ROOT / "examples" / "alpha_star_connect4.yaml")
    p.add_argument("--workers", type=int, default=None, help="Ray rollout actors (default: the config's)")
    p.add_argument("--games", type=int, default=200, help="evaluation games per opponent (half as first player)")
    args = p.parse_args()

    data = yaml.safe_load(args.config.read_text())
    data.pop("algo", None)
    data.pop("stop", None)
    if args.workers is not None:
        data.setdefault("resources", {})["num_workers"] = args.workers
    cfg = AlphaStarConfig(**data)
    print(
        f"league_connect4: budget {args.budget_s:.0f} s, config {args.config.name}, "
        f"{cfg.resources.num_workers} rollout actors x {cfg.resources.num_envs_per_worker} envs",
        flush=True,
    )
    t0 = time.perf_counter()
    algo = cfg.build()
    try:
        train_s, steps, r = 0.0, 0, {}
        while time.perf_counter() - t0 < args.budget_s:
            r = algo.train()
            train_s, steps = r["time_total_s"], r["env_steps_sampled"]
            print(
                f"  {time.perf_counter() - t0:6.0f} s  iter {r['iteration']:3d}  env steps {steps:9d}  "
                f"{r['env_steps_per_s']:7.0f}/s  trained {r['env_steps_trained']:9d}  players {r['num_policies']:2d}  "
                f"main return {r.get('policy_return_mean/main', float('nan')):+.2f}",
                flush=True,
            )
        wall = time.perf_counter() - t0
        vs_random = algo.evaluate_vs("random", args.games)
        vs_heuristic = algo.evaluate_vs("heuristic", args.games)
        vs_heuristic2 = algo.evaluate_vs("heuristic2", args.games)
        players = len(algo.policies.ids)
        league = algo.league.metrics()
    finally:
        algo.stop()
    print(
        f"main vs random:    {vs_random['win_rate']:.3f} (draws {vs_random['draw_rate']:.3f}, "
        f"first {vs_random['win_rate_first']:.3f}, second {vs_random['win_rate_second']:.3f})"
    )
    for name, out in (("heuristic", vs_heuristic), ("heuristic2", vs_heuristic2)):
        print(
            f"main vs {name + ':':11s} {out['win_rate']:.3f} (draws {out['draw_rate']:.3f}, "
            f"first {out['win_rate_first']:.3f}, second {out['win_rate_second']:.3f})"
        )
    print(
        json.dumps(
            {
                "benchmark": "league_connect4",
                "budget_s": args.budget_s,
                "env_steps_per_s": round(steps / train_s, 1) if train_s else 0.0,
                "players": players,
                "win_rate_vs_random": vs_random["win_rate"],
                "win_rate_vs_heuristic": vs_heuristic["win_rate"],
                "win_rate_vs_heuristic2": vs_heuristic2["win_rate"],
                "games_per_opponent": vs_random["games"],
                "env_steps": steps,
                "env_steps_trained": r.get("env_steps_trained", 0),
                "wall_s": round(wall, 1),
                "learning_policies": int(league["league/learning"]),
                "league_games": int(league["league/games_total"]),
                "num_workers": cfg.resources.num_workers,
            }
        )
    )


if __name__ == "__main__":
    main()
