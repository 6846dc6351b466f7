"""Multi-agent APPO against single-agent APPO on the same CartPole steps: throughput and learning.

Single-agent: APPO on CartPole-v1 with 16 envs. Multi-agent: APPO with a ``multi_agent``
section (one shared policy) on ``shoal.envs.multi_cartpole`` with 4 poles per env and 4 env
copies, so both step 16 CartPoles per tick with the same network, learner thread and schedule
(examples/appo_cartpole.yaml's, with 16 envs). One agent step is one CartPole step in both.
Each mode runs in its own fresh process for ``--budget-s`` seconds after a first iteration
(which starts the learner thread) is left out:

    python benchmarks/multi_agent_appo.py [--budget-s 60]

Per mode: agent steps sampled and trained per second, learner updates per second and the
mean return of the last 100 episodes (multi-agent: per pole). The last stdout line is one
JSON object with ``"benchmark": "multi_agent_appo"`` and the multi/single ratios.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _spawn import REPO, run_child  # noqa: E402

NUM_ENVS, NUM_POLES = 16, 4


def _config(mode: str, seed: int):
    from shoal.algorithms.appo import APPOConfig
    from shoal.config import load_yaml

    data = load_yaml(REPO / "examples" / "appo_cartpole.yaml")
    data.pop("stop", None)
    data.pop("algo", None)
    data.update(seed=seed, min_time_s_per_iteration=5)
    if mode == "single":
        data["resources"] = {"num_workers": 0, "num_envs_per_worker": NUM_ENVS}
    else:
        data.update(
            env="shoal.envs.multi_cartpole:parallel_env",
            env_config={"num_agents": NUM_POLES},
            multi_agent={"policies": {"shared": None}},
        )
        data["resources"] = {"num_workers": 0, "num_envs_per_worker": NUM_ENVS // NUM_POLES}
    return APPOConfig.from_dict(data)


def child(mode: str, budget_s: float, seed: int) -> dict:
    algo = _config(mode, seed).build()
    try:
        first = algo.train()  # starts the learner thread; left out of the rates
        agent_key = "agent_steps_sampled" if mode == "multi" else "env_steps_sampled"
        s0, t0, u0 = first[agent_key], first["env_steps_trained"], first["num_updates"]
        start = time.perf_counter()
        r = first
        while time.perf_counter() - start < budget_s:
            r = algo.train()
        elapsed = time.perf_counter() - start
        ret = (
            r.get("policy_return_mean/shared", r["episode_return_mean"])
            if mode == "multi"
            else r["episode_return_mean"]
        )
        return {
            "mode": mode,
            "seconds": round(elapsed, 1),
            "agent_steps_sampled_per_s": (r[agent_key] - s0) / elapsed,
            "agent_steps_trained_per_s": (r["env_steps_trained"] - t0) / elapsed,
            "learner_updates_per_s": (r["num_updates"] - u0) / elapsed,
            "return_mean": ret,
            "agent_steps_sampled": int(r[agent_key]),
        }
    finally:
        algo.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget-s", type=float, default=60.0, help="measured seconds per mode")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child", choices=["single", "multi"], help=argparse.SUPPRESS)
    p.add_argument("--spawn-time", type=float, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.budget_s, args.seed)))
        return
    out = {}
    for mode in ("single", "multi"):
        out[mode] = run_child(
            __file__,
            ["--child", mode, "--budget-s", str(args.budget_s), "--seed", str(args.seed)],
            timeout_s=args.budget_s + 300,
        )
        print(f"[multi_agent_appo] {mode}: {out[mode]}", file=sys.stderr)
    ratios = {}
    if all("error" not in out[m] for m in out):
        ratios = {
            f"{k}_ratio": out["multi"][k] / out["single"][k]
            for k in ("agent_steps_sampled_per_s", "agent_steps_trained_per_s", "learner_updates_per_s")
        }
    print(
        json.dumps(
            {"benchmark": "multi_agent_appo", "budget_s": args.budget_s, "num_cartpoles": NUM_ENVS, **out, **ratios}
        )
    )


if __name__ == "__main__":
    main()
