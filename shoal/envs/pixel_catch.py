"""PixelCatch: a tiny pixel game for checking a pixel pipeline in seconds, not hours.

A ball falls one row per step down a ``size`` x ``size`` screen; the agent moves a 3-pixel
paddle along the bottom row (0: left, 1: stay, 2: right). When the ball reaches the bottom
row the episode ends with +1 if the paddle is under it and -1 otherwise. One uint8 frame,
channel-first ``(1, size, size)`` with 255 where the ball and paddle are, holds the whole
state. A uniformly random policy scores about -0.4 on average; a perfect one +1. With
``render_mode="rgb_array"``, ``render()`` returns the frame as RGB, each pixel an 8x8 block.

    from shoal import PPOConfig
    config = PPOConfig(env="shoal.envs.pixel_catch:PixelCatch", model={"torso": "conv", ...})
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class PixelCatch(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}
    RENDER_SCALE = 8  # screen pixels per game pixel in render()

    def __init__(self, size: int = 10, render_mode: str | None = None) -> None:
        if size < 5:
            raise ValueError(f"PixelCatch needs size >= 5, got {size}")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"PixelCatch renders only rgb_array frames, not {render_mode!r}")
        self.size = size
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0, 255, (1, size, size), np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self.ball_row = self.ball_col = self.paddle = 0

    def _frame(self) -> np.ndarray:
        frame = np.zeros((1, self.size, self.size), np.uint8)
        frame[0, self.ball_row, self.ball_col] = 255
        frame[0, -1, max(self.paddle - 1, 0) : self.paddle + 2] = 255
        return frame

    def render(self) -> np.ndarray | None:
        """The frame as ``(size * 8, size * 8, 3)`` uint8 RGB, or None without ``render_mode="rgb_array"``."""
        if self.render_mode != "rgb_array":
            return None
        big = self._frame()[0].repeat(self.RENDER_SCALE, 0).repeat(self.RENDER_SCALE, 1)
        return np.repeat(big[:, :, None], 3, axis=2)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.ball_row = 0
        self.ball_col = int(self.np_random.integers(self.size))
        self.paddle = int(self.np_random.integers(1, self.size - 1))
        return self._frame(), {}

    def step(self, action):
        self.paddle = int(np.clip(self.paddle + int(action) - 1, 1, self.size - 2))
        self.ball_row += 1
        done = self.ball_row == self.size - 1
        reward = (1.0 if abs(self.ball_col - self.paddle) <= 1 else -1.0) if done else 0.0
        return self._frame(), reward, done, False, {}
