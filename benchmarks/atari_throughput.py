"""Atari throughput on ALE/Pong-v5: raw env frames/s (both back ends), end-to-end training
frames/s of APPO, IMPALA and PPO with the Nature CNN, and Stable-Baselines3's PPO on the same
env when it is installed (the ``bench`` extra).

    python benchmarks/atari_throughput.py [--budget-s 120] [--env ALE/Pong-v5]

Each training run starts a fresh Python process from its preset (``examples/<algo>_pong.yaml``)
with the standard 84x84 frames, the id's sticky actions and the Nature CNN in place of the
preset's own frame size, sticky actions and model; IMPALA and APPO learn each batch once
(``ASYNC_SCHEDULE`` below: their papers' schedule, not the APPO preset's 4 passes). Each
trains for its share of the budget; its rate is the env frames trained (agent steps x frame
skip) between the end of its first iteration and the end of its last, over that wall time,
so start-up is left out. PPO is the like-for-like row: both shoal's PPO and Stable-Baselines3's
run the RL Zoo's Atari PPO settings (8 envs in one process, 128 steps each, 4 epochs over
minibatches of 256, lr 2.5e-4, clip 0.1, value weight 0.5, entropy 0.01, gradient norm 0.5,
the Nature CNN at 84x84 with 4 stacked frames, one torch thread) on the same id with the same
frame skip and sticky actions; SB3 through its own ``make_atari_env``, timed the same way
(after its first rollout). IMPALA and APPO have no SB3 counterpart: their rows are shoal's
alone.

``bytes_per_transition`` is what one transition costs in flight: the bytes of a train batch
that APPO's rollout code produces, over its rows (uint8 frames: 4 x 84 x 84 = 28,224 bytes
of observation). Progress goes to stderr; the last stdout line is one JSON object with
``raw_frames_per_s`` (the default back end's), ``raw_frames_per_s_<backend>``,
``appo_frames_per_s``, ``impala_frames_per_s``, ``ppo_frames_per_s``,
``sb3_ppo_frames_per_s`` (null when SB3 is missing), ``bytes_per_transition``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from _spawn import run_child

REPO = Path(__file__).resolve().parent.parent
ALGOS = ("appo", "impala", "ppo")
NATURE_CNN = {"torso": "nature_cnn", "hiddens": [], "activation": "relu", "vf_share_layers": True}
# IMPALA and APPO are measured with their own papers' schedule, each batch learned once (the
# algorithms' default num_sgd_iter), not the Pong presets' sample-efficiency schedule (APPO's
# learns each batch 4 times).
ASYNC_SCHEDULE = {"num_sgd_iter": 1, "minibatch_buffer_size": 1, "rollout_fragment_length": 32, "train_batch_size": 512}
# PPO runs what child_sb3 gives Stable-Baselines3 (the RL Zoo's atari entry), not the Pong
# preset's 16 x 64 steps and minibatches of 128, so that the two PPO rows compare like for like.
SB3_ENVS = 8
SB3_PPO = {
    "n_steps": 128,
    "n_epochs": 4,
    "batch_size": 256,
    "learning_rate": 2.5e-4,
    "clip_range": 0.1,
    "vf_coef": 0.5,
    "ent_coef": 0.01,
    "max_grad_norm": 0.5,
}
PPO_LIKE_SB3 = {
    "train_batch_size": SB3_ENVS * SB3_PPO["n_steps"],
    "minibatch_size": SB3_PPO["batch_size"],
    "num_sgd_iter": SB3_PPO["n_epochs"],
    "lr": SB3_PPO["learning_rate"],
    "clip_param": SB3_PPO["clip_range"],
    "vf_loss_coeff": SB3_PPO["vf_coef"],
    "entropy_coeff": SB3_PPO["ent_coef"],
    "grad_clip": SB3_PPO["max_grad_norm"],
}


def log(msg: str) -> None:
    print(f"[atari_throughput] {msg}", file=sys.stderr, flush=True)


def raw_rate(env_id: str, backend: str, seconds: float, num_envs: int = 8) -> float:
    """Frames/s of the preprocessed vector env under uniformly random actions."""
    import numpy as np

    from shoal.config import EnvPreprocessingConfig
    from shoal.envs.make import make_vec_env

    p = EnvPreprocessingConfig(backend=backend)
    env = make_vec_env(env_id, num_envs, seed=0, preprocessing=p)
    rng = np.random.default_rng(0)
    n = int(env.single_action_space.n)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(rng.integers(n, size=num_envs))
        steps += num_envs
    elapsed = time.perf_counter() - start
    env.close()
    return steps * p.frame_skip / elapsed


def bytes_per_transition(config) -> float:
    """Bytes per row of a train batch as APPO's rollout code builds it (time-major sequences)."""
    from shoal.rollout.env_runner import EnvRunner
    from shoal.rollout.policies import ActorCriticPolicy
    from shoal.rollout.postprocessing import sequence_postprocess

    runner = EnvRunner(config, 0, ActorCriticPolicy, sequence_postprocess, config.fragment_length())
    batch, _ = runner.sample()
    runner.stop()
    return sum(v.nbytes for v in batch.data.values()) / len(batch)


# ---- children: one training run each, in a fresh process -----------------------------------
def child_shoal(algo_name: str, env_id: str, seconds: float) -> dict:
    import torch

    from shoal import runtime
    from shoal.algorithms import get_config_class
    from shoal.config import load_yaml

    torch.set_num_threads(1)
    data = load_yaml(REPO / "examples" / f"{algo_name}_pong.yaml")
    data.pop("stop", None)
    data.pop("algo", None)
    data["env"] = env_id
    # The measurement is of the standard set-up, whatever a preset trains with: 84x84 frames,
    # the id's own sticky actions (as SB3 gets them), the Nature CNN.
    data["env_preprocessing"] = {**data.get("env_preprocessing", {}), "screen_size": 84}
    data["env_preprocessing"].pop("repeat_action_probability", None)
    data["model"] = NATURE_CNN
    if algo_name in ("appo", "impala"):
        data.update(ASYNC_SCHEDULE)
    else:
        data.update(PPO_LIKE_SB3)
        data["resources"] = {**data.get("resources", {}), "num_workers": 0, "num_envs_per_worker": SB3_ENVS}
    config = get_config_class(algo_name)(**data, seed=0)
    algo = config.build()
    skip = config.env_preprocessing.frame_skip
    out: dict = {"algo": algo_name}
    try:
        first = algo.train()
        t0, trained0, start = first["time_total_s"], first["env_steps_trained"], time.time()
        result = first
        while time.time() - start < seconds:
            result = algo.train()
            log(
                f"{algo_name}: it {result['iteration']}, {result['env_steps_trained']} trained, "
                f"return {result['episode_return_mean']:.1f}"
            )
        elapsed = result["time_total_s"] - t0
        out["frames_per_s"] = (result["env_steps_trained"] - trained0) * skip / elapsed if elapsed > 0 else None
        out["sampled_frames_per_s"] = result["env_steps_sampled"] * skip / result["time_total_s"]
    finally:
        algo.stop()
        runtime.shutdown()
    if algo_name == "appo":
        out["bytes_per_transition"] = bytes_per_transition(config)
    return out


def child_sb3(env_id: str, seconds: float) -> dict:
    try:
        from stable_baselines3 import PPO
        from stable_baselines3.common.callbacks import BaseCallback
        from stable_baselines3.common.env_util import make_atari_env
        from stable_baselines3.common.vec_env import VecFrameStack
    except ImportError:
        return {"frames_per_s": None, "note": "stable_baselines3 is not installed (pip install 'shoal[bench]')"}

    class Clock(BaseCallback):
        """Stops after ``seconds`` past the first rollout; records steps and time from then."""

        def __init__(self):
            super().__init__()
            self.t0 = self.steps0 = None

        def _on_rollout_end(self) -> None:
            if self.t0 is None:
                self.t0, self.steps0 = time.perf_counter(), self.num_timesteps

        def _on_step(self) -> bool:
            return self.t0 is None or time.perf_counter() - self.t0 < seconds

    import ale_py
    import gymnasium as gym
    import torch

    torch.set_num_threads(1)  # as the shoal rows run
    gym.register_envs(ale_py)
    env = VecFrameStack(make_atari_env(env_id, n_envs=SB3_ENVS, seed=0, env_kwargs={"frameskip": 1}), n_stack=4)
    model = PPO("CnnPolicy", env, **SB3_PPO, verbose=0, seed=0, device="cpu")
    clock = Clock()
    model.learn(total_timesteps=10**9, callback=clock)
    elapsed = time.perf_counter() - clock.t0
    return {"frames_per_s": (model.num_timesteps - clock.steps0) * 4 / elapsed}


def main() -> None:
    p = argparse.ArgumentParser(description="Atari throughput: raw env, APPO, IMPALA, PPO and SB3 PPO frames/s.")
    p.add_argument("--budget-s", type=float, default=120.0, help="total wall-clock budget, roughly")
    p.add_argument("--env", default="ALE/Pong-v5")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--spawn-time", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child == "sb3":
        print(json.dumps(child_sb3(args.env, args.seconds)), flush=True)
        return
    if args.child is not None:
        print(json.dumps(child_shoal(args.child, args.env, args.seconds)), flush=True)
        return

    from shoal.config import EnvPreprocessingConfig

    raw_s = max(5.0, 0.05 * args.budget_s)
    out: dict = {"benchmark": "atari_throughput", "env": args.env, "budget_s": args.budget_s}
    for backend in ("ale_vector", "gymnasium"):
        out[f"raw_frames_per_s_{backend}"] = raw_rate(args.env, backend, raw_s)
        log(f"raw env, {backend}: {out[f'raw_frames_per_s_{backend}']:.0f} frames/s")
    out["raw_frames_per_s"] = out[f"raw_frames_per_s_{EnvPreprocessingConfig().resolved_backend()}"]
    train_s = max(10.0, (args.budget_s - 2 * raw_s) / 4)
    for name in (*ALGOS, "sb3"):
        log(f"{name}: training for {train_s:.0f} s in a fresh process")
        r = run_child(__file__, ["--child", name, "--seconds", str(train_s), "--env", args.env], train_s + 300)
        key = "sb3_ppo" if name == "sb3" else name
        out[f"{key}_frames_per_s"] = r.get("frames_per_s")
        if name == "appo":
            out["bytes_per_transition"] = r.get("bytes_per_transition")
        if r.get("error") or r.get("note"):
            out[f"{key}_note"] = r.get("error") or r.get("note")
        log(f"{name}: {r}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
