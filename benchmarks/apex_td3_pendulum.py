"""Ape-X TD3 on Pendulum-v1 with 2 rollout actors: seconds from process start until the mean
return of the last 20 episodes reaches -200, beside Stable-Baselines3's TD3 with the RL Zoo's
settings.

Each run is a fresh Python process (this script in child mode), so interpreter start, Ray's
start, imports and set-up count. shoal trains ``examples/apex_td3_pendulum.yaml`` (2 rollout
actors, 2 replay shards, the learner thread in the driver); its episodes are those Ape-X
reports, the lowest-noise third of the envs (here the second actor's). SB3 trains
``TD3("MlpPolicy", "Pendulum-v1")`` with the RL Zoo's ``td3.yml`` entry for Pendulum-v1: gamma
0.98, buffer 200,000, 10,000 random steps first, Gaussian action noise of std 0.1, one update
per env step done after each episode, lr 1e-3, [400, 300] networks. One torch thread each
(``--threads``). A run stops at the target or at ``--max-seconds``.

    python benchmarks/apex_td3_pendulum.py [--seeds 3] [--max-seconds 180] [--only shoal,sb3] [--config F]

Progress goes to stderr; the last stdout line is one JSON object like ``sac_pendulum.py``'s:
``{"benchmark": "apex_td3_pendulum", "target", "shoal_median_seconds", "shoal_median_env_steps",
"shoal_solved", "sb3_median_seconds", "sb3_median_env_steps", "sb3_solved", "speedup", "runs"}``.
"""

from __future__ import annotations

from pathlib import Path

from sac_pendulum import compare, sb3_until_target, train_shoal

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "examples" / "apex_td3_pendulum.yaml"


def child_shoal(seed: int, spawn_time: float, max_seconds: float, threads: int, config: str) -> dict:
    from shoal.algorithms.apex_td3 import ApeXTD3Config

    return train_shoal(ApeXTD3Config, seed, spawn_time, max_seconds, threads, config)


def child_sb3(seed: int, spawn_time: float, max_seconds: float, threads: int, config: str) -> dict:
    import numpy as np
    import torch
    from stable_baselines3 import TD3
    from stable_baselines3.common.noise import NormalActionNoise

    torch.set_num_threads(threads)
    out = {"lib": "sb3", "seed": seed, "solved": False, "seconds": None, "env_steps": None}
    model = TD3(
        "MlpPolicy",
        "Pendulum-v1",
        gamma=0.98,
        buffer_size=200_000,
        learning_starts=10_000,
        action_noise=NormalActionNoise(np.zeros(1), 0.1 * np.ones(1)),
        gradient_steps=-1,
        train_freq=(1, "episode"),
        learning_rate=1e-3,
        policy_kwargs={"net_arch": [400, 300]},
        seed=seed,
        device="cpu",
        verbose=0,
    )
    model.learn(total_timesteps=10**7, callback=sb3_until_target(out, spawn_time, max_seconds))
    return out


def main() -> None:
    compare("apex_td3_pendulum", __doc__, {"shoal": child_shoal, "sb3": child_sb3}, CONFIG, __file__)


if __name__ == "__main__":
    main()
