"""Memory: StatelessCartPole (CartPole-v1 without the two velocities) with and without an LSTM.

    python benchmarks/recurrent.py [--budget-s 300] [--seed 0] [--only ppo_lstm,appo_lstm,mlp,sb3]

Each run trains in a fresh Python process (start-up counts) on ``shoal/StatelessCartPole-v1``
and stops when the mean return of the last 100 episodes first reaches 450, or at the budget:

- ``ppo_lstm``: ``examples/ppo_lstm_stateless_cartpole.yaml``;
- ``appo_lstm``: ``examples/appo_lstm_stateless_cartpole.yaml``;
- ``mlp``: the PPO preset with a plain MLP (``model.use_lstm`` off, the LSTM keys dropped): a
  feed-forward policy cannot tell the pole's speed, and should stay far below;
- ``sb3``: sb3-contrib's RecurrentPPO (when installed: the ``bench`` extra) with the RL Zoo's
  tuned CartPoleNoVel-v1 settings (8 envs x 32 steps, 20 epochs of 256-step minibatches, LSTM of
  64, observation normalization, learning rate and clip range annealed over 100k steps, as the
  zoo trains it; ``--sb3-timesteps`` stretches that schedule).

Progress goes to stderr; the last stdout line is one JSON object with ``ppo_lstm_seconds_to_450``,
``appo_lstm_seconds_to_450``, ``mlp_best_return``, ``sb3_recurrent_ppo_seconds_to_450`` (null
when not installed or not reached), and per run the env steps, best return and seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from _spawn import run_child

REPO = Path(__file__).resolve().parent.parent
ENV = "shoal/StatelessCartPole-v1"
TARGET = 450.0
RUNS = ("ppo_lstm", "appo_lstm", "mlp", "sb3")
PRESETS = {
    "ppo_lstm": ("ppo", "ppo_lstm_stateless_cartpole.yaml"),
    "appo_lstm": ("appo", "appo_lstm_stateless_cartpole.yaml"),
    "mlp": ("ppo", "ppo_lstm_stateless_cartpole.yaml"),
}
SB3_ZOO = dict(
    n_envs=8,
    n_steps=32,
    batch_size=256,
    gae_lambda=0.8,
    gamma=0.98,
    n_epochs=20,
    ent_coef=0.0,
    learning_rate=1e-3,
    clip_range=0.2,
    n_timesteps=100_000,
)


def log(msg: str) -> None:
    print(f"[recurrent] {msg}", file=sys.stderr, flush=True)


def shoal_child(run: str, budget_s: float, seed: int, spawn_time: float) -> dict:
    import torch

    from shoal import runtime
    from shoal.algorithms import get_config_class
    from shoal.config import load_yaml

    torch.set_num_threads(1)
    algo_name, preset = PRESETS[run]
    data = load_yaml(REPO / "examples" / preset)
    data.pop("stop", None)
    data.pop("algo", None)
    if run == "mlp":  # the same config, feed-forward
        data["model"] = {
            k: v for k, v in data.get("model", {}).items() if k not in ("use_lstm", "lstm_cell_size", "max_seq_len")
        }
    algo = get_config_class(algo_name)(**data, seed=seed).build()
    out = {"run": run, "reached": False, "seconds_to_450": None, "env_steps": 0, "best_return": None}
    try:
        while time.time() - spawn_time < budget_s:
            r = algo.train()
            ret = r.get("episode_return_mean")
            seconds = time.time() - spawn_time
            out["env_steps"] = int(r["env_steps_sampled"])
            if ret is not None and r.get("episodes_total", 0) >= 100:
                out["best_return"] = ret if out["best_return"] is None else max(out["best_return"], ret)
                if ret >= TARGET:
                    out.update(reached=True, seconds_to_450=seconds)
                    break
            if r["iteration"] % 10 == 0:
                log(f"{run}: {seconds:.0f} s, {out['env_steps']} steps, mean of last 100: {ret}")
    finally:
        algo.stop()
        runtime.shutdown()
    out["seconds"] = time.time() - spawn_time
    return out


def sb3_child(budget_s: float, seed: int, spawn_time: float, timesteps: int) -> dict:
    out = {"run": "sb3", "reached": False, "seconds_to_450": None, "env_steps": 0, "best_return": None}
    try:
        from sb3_contrib import RecurrentPPO
    except ImportError:
        out["error"] = "sb3-contrib is not installed (pip install 'shoal[bench]')"
        return out
    import numpy as np
    import torch
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    import shoal.envs  # noqa: F401  (registers the env id)

    torch.set_num_threads(1)
    z = {**SB3_ZOO, "n_timesteps": timesteps}

    def linear(start: float):
        return lambda progress_remaining: progress_remaining * start

    class Watch(BaseCallback):
        def _on_step(self) -> bool:
            buf = self.model.ep_info_buffer
            seconds = time.time() - spawn_time
            out["env_steps"] = int(self.num_timesteps)
            if len(buf) >= 100:
                ret = float(np.mean([e["r"] for e in buf]))
                out["best_return"] = ret if out["best_return"] is None else max(out["best_return"], ret)
                if ret >= TARGET:
                    out.update(reached=True, seconds_to_450=seconds)
                    return False
            return seconds < budget_s

    env = VecNormalize(make_vec_env(ENV, n_envs=z["n_envs"], seed=seed), norm_obs=True, norm_reward=False)
    model = RecurrentPPO(
        "MlpLstmPolicy",
        env,
        n_steps=z["n_steps"],
        batch_size=z["batch_size"],
        gae_lambda=z["gae_lambda"],
        gamma=z["gamma"],
        n_epochs=z["n_epochs"],
        ent_coef=z["ent_coef"],
        learning_rate=linear(z["learning_rate"]),
        clip_range=linear(z["clip_range"]),
        policy_kwargs=dict(
            ortho_init=False,
            activation_fn=torch.nn.ReLU,
            lstm_hidden_size=64,
            enable_critic_lstm=True,
            net_arch=dict(pi=[64], vf=[64]),
        ),
        seed=seed,
        device="cpu",
        verbose=0,
    )
    model.learn(total_timesteps=z["n_timesteps"], callback=Watch())
    out["seconds"] = time.time() - spawn_time
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description="Seconds to a last-100 mean of 450 on StatelessCartPole, LSTM vs MLP vs SB3."
    )
    p.add_argument("--budget-s", type=float, default=300.0, help="per run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default=",".join(RUNS), help=f"comma-separated subset of {', '.join(RUNS)}")
    p.add_argument(
        "--sb3-timesteps",
        type=int,
        default=SB3_ZOO["n_timesteps"],
        help="RecurrentPPO's total timesteps (its learning rate and clip range anneal over them); default: "
        "the RL Zoo's 100,000",
    )
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--spawn-time", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        spawn = args.spawn_time or time.time()
        r = (
            sb3_child(args.budget_s, args.seed, spawn, args.sb3_timesteps)
            if args.child == "sb3"
            else shoal_child(args.child, args.budget_s, args.seed, spawn)
        )
        print(json.dumps(r), flush=True)
        return
    runs = [r.strip() for r in args.only.split(",") if r.strip()]
    bad = sorted(set(runs) - set(RUNS))
    if bad:
        raise SystemExit(f"--only: unknown run(s) {bad}; choose from {', '.join(RUNS)}")
    results = {}
    for run in runs:
        log(f"{run}: fresh process, budget {args.budget_s:.0f} s")
        results[run] = run_child(
            __file__,
            [
                "--child",
                run,
                "--budget-s",
                str(args.budget_s),
                "--seed",
                str(args.seed),
                "--sb3-timesteps",
                str(args.sb3_timesteps),
            ],
            args.budget_s + 300,
        )
        log(f"{run}: {results[run]}")

    def seconds(run: str):
        return results.get(run, {}).get("seconds_to_450")

    out = {
        "benchmark": "recurrent",
        "env": ENV,
        "budget_s": args.budget_s,
        "seed": args.seed,
        "ppo_lstm_seconds_to_450": seconds("ppo_lstm"),
        "appo_lstm_seconds_to_450": seconds("appo_lstm"),
        "mlp_best_return": results.get("mlp", {}).get("best_return"),
        "sb3_recurrent_ppo_seconds_to_450": seconds("sb3"),
        "sb3_timesteps": args.sb3_timesteps,
        "runs": results,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
