"""Helpers for the Tune tests, importable by Ray actors (tests/ is on their PYTHONPATH)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import gymnasium as gym


class KilledOnceCartPole(gym.Wrapper):
    """CartPole whose process is killed (SIGKILL, as by the OOM killer) at its ``kill_at``-th step,
    once per ``marker`` file: the first process to get there creates the file and dies."""

    def __init__(self, marker: str, kill_at: int = 50, **kwargs) -> None:
        super().__init__(gym.make("CartPole-v1", **kwargs))
        self.marker, self.kill_at, self.steps = Path(marker), kill_at, 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.kill_at and not self.marker.exists():
            import ray

            pg = ray.util.get_current_placement_group()  # the group this actor was placed in
            self.marker.write_text(json.dumps({"pid": os.getpid(), "bundles": pg.bundle_specs if pg else None}))
            os.kill(os.getpid(), signal.SIGKILL)
        return self.env.step(action)
