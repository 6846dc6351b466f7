"""TD3 on Pendulum-v1: seconds from process start until the mean return of the last 20 episodes
reaches -200, shoal's Ape-X TD3 beside Stable-Baselines3's TD3 on SB3's settings (the
like-for-like row), and shoal's tuned preset as a separate, labelled row.

Rows (``--only``, all by default):

- ``sb3``: ``TD3("MlpPolicy", "Pendulum-v1")`` with the RL Zoo's ``td3.yml`` entry for
  Pendulum-v1: gamma 0.98, buffer 200,000, 10,000 random steps first, Gaussian action noise of
  std 0.1, one update per env step done after each episode, lr 1e-3, [400, 300] networks.
- ``shoal``: ``benchmarks/configs/apex_td3_pendulum_sb3.yaml`` (``--config``): the same
  settings key for key, in one process like SB3's (no Ray): the env steps in the driver's thread
  while the learner thread trains, where SB3 acts and learns in turn; every episode counted.
- ``shoal_preset``: ``examples/apex_td3_pendulum.yaml`` (``--preset``): 2 rollout actors of
  different noise, [64, 64] networks, 1,000 warm-up steps, 3-step returns, priorities, counting
  the lowest-noise actor's episodes: not like for like, reported as its own row.

Each run is a fresh Python process (this script in child mode), so interpreter start, Ray's
start, imports and set-up count; one torch thread each (``--threads``). Every row checks the
target after every episode. A run stops at the target or at ``--max-seconds``.

    python benchmarks/apex_td3_pendulum.py [--seeds 3] [--max-seconds 180] [--only shoal,sb3,shoal_preset]
                                           [--config F] [--preset F]

Progress goes to stderr; the last stdout line is one JSON object with the keys of
``sac_pendulum.py``'s (``speedup_like_for_like``, ``env_steps_ratio_like_for_like``,
``speedup_preset``, per-row medians and ranges, ``runs``), ``benchmark`` "apex_td3_pendulum".
"""

from __future__ import annotations

from pathlib import Path

from sac_pendulum import compare, sb3_until_target, train_shoal

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "benchmarks" / "configs" / "apex_td3_pendulum_sb3.yaml"
PRESET = REPO / "examples" / "apex_td3_pendulum.yaml"


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
    children = {"shoal": child_shoal, "sb3": child_sb3, "shoal_preset": child_shoal}
    compare("apex_td3_pendulum", __doc__, children, CONFIG, PRESET, __file__)


if __name__ == "__main__":
    main()
