"""StatelessCartPole: CartPole-v1 that shows the cart's position and the pole's angle, not their speeds.

The two velocities are what make CartPole a fully observed problem; without them a single
observation cannot tell a pole falling left from one swinging back, and a feed-forward policy
stays far from the 500-step maximum while a recurrent one (``model.use_lstm``) can infer the
speeds from the last few steps. The dynamics, rewards, the 500-step limit and the reward
threshold (475) are CartPole-v1's. ``import shoal`` registers it::

    from shoal.algorithms.ppo import PPOConfig

    config = PPOConfig(env="shoal/StatelessCartPole-v1", model={"use_lstm": True})

Vectorized, it uses Gymnasium's own vector CartPole (one numpy step for all envs), so it
samples as fast as CartPole-v1 does.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv, CartPoleVectorEnv

ENV_ID = "shoal/StatelessCartPole-v1"
OBSERVED = [0, 2]  # cart position, pole angle (velocities 1 and 3 are hidden)


def _observed_space(space: gym.spaces.Box) -> gym.spaces.Box:
    return gym.spaces.Box(space.low[OBSERVED], space.high[OBSERVED], dtype=np.float32)


class StatelessCartPole(CartPoleEnv):
    """CartPole whose observation is ``[cart position, pole angle]``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.observation_space = _observed_space(self.observation_space)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = super().reset(seed=seed, options=options)
        return obs[OBSERVED], info

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs[OBSERVED], reward, terminated, truncated, info


class StatelessCartPoleVector(CartPoleVectorEnv):
    """The vectorized form: CartPole's vector env, observations cut to the same two columns."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.single_observation_space = _observed_space(self.single_observation_space)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = super().reset(seed=seed, options=options)
        return obs[:, OBSERVED], info

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs[:, OBSERVED], reward, terminated, truncated, info


def register() -> None:
    """Register :data:`ENV_ID` with Gymnasium (once)."""
    if ENV_ID not in gym.envs.registry:
        gym.register(
            ENV_ID,
            entry_point=StatelessCartPole,
            vector_entry_point=StatelessCartPoleVector,
            max_episode_steps=500,
            reward_threshold=475.0,
        )
