"""CartPole with injected faults, for the env-failure tests (importable by Ray actors too).

``FlakyCartPole(fail_at=N)`` raises ``RuntimeError("boom ...")`` on the N-th step of each
instance's life; ``healthy=K`` spares the first K instances built in this process under ``tag``,
and ``faulty=M`` makes only the M after them fail (None: all of them). ``fail_in="reset"`` raises in
every reset instead (after the first ``healthy`` instances). ``nan_at=N`` puts a NaN into the
``nan_field`` ("reward" or "observation") of the N-th step instead of raising.
"""

from __future__ import annotations

from collections import Counter

import gymnasium as gym
import numpy as np

INSTANCES: Counter = Counter()  # instances built per tag, in this process


class FlakyCartPole(gym.Wrapper):
    def __init__(
        self,
        fail_at: int | None = None,
        healthy: int = 0,
        faulty: int | None = None,
        tag: str = "",
        fail_in: str = "step",
        nan_at: int | None = None,
        nan_field: str = "reward",
        **kwargs,
    ) -> None:
        super().__init__(gym.make("CartPole-v1", **kwargs))
        INSTANCES[tag] += 1
        self.faulty = healthy < INSTANCES[tag] <= (healthy + faulty if faulty is not None else INSTANCES[tag])
        self.fail_at, self.fail_in, self.nan_at, self.nan_field = fail_at, fail_in, nan_at, nan_field
        self.steps = 0

    def reset(self, **kwargs):
        if self.faulty and self.fail_in == "reset":
            raise RuntimeError("boom in reset: the simulator would not start")
        return self.env.reset(**kwargs)

    def step(self, action):
        self.steps += 1
        if self.faulty and self.fail_in == "step" and self.steps == self.fail_at:
            raise RuntimeError(f"boom at step {self.steps}: the simulator crashed")
        obs, r, term, trunc, info = self.env.step(action)
        if self.nan_at is not None and self.steps == self.nan_at:
            if self.nan_field == "reward":
                r = float("nan")
            else:
                obs = np.full_like(obs, np.inf)
        return obs, r, term, trunc, info


def nan_multi_cartpole(nan_at: int = 5):
    """Two CartPole agents (PettingZoo) whose rewards are NaN at the ``nan_at``-th step."""
    from multi_cartpole import MultiCartPole

    class NanMultiCartPole(MultiCartPole):
        steps = 0

        def step(self, actions):
            obs, rew, term, trunc, infos = super().step(actions)
            self.steps += 1
            if self.steps == nan_at:
                rew = {a: float("nan") for a in rew}
            return obs, rew, term, trunc, infos

    return NanMultiCartPole(num_agents=2)


class HangingCartPole(gym.Wrapper):
    """CartPole whose ``hang_at``-th step sleeps forever in the first ``times`` instances, in any
    process, to get there: each claims a marker file (``marker``, then ``marker.1``, ...: created
    atomically), so ``times`` envs hang once each and the env of the actor that replaces the last
    runs on."""

    def __init__(self, hang_at: int = 20, marker: str = "", times: int = 1, **kwargs) -> None:
        super().__init__(gym.make("CartPole-v1", **kwargs))
        self.hang_at, self.marker, self.times, self.steps = hang_at, marker, times, 0

    def step(self, action):
        self.steps += 1
        if self.steps == self.hang_at and self.marker:
            import time

            if any(_claim(self.marker + (f".{k}" if k else "")) for k in range(self.times)):
                while True:
                    time.sleep(3600)
        return self.env.step(action)


class HangInInitCartPole(gym.Wrapper):
    """CartPole whose constructor sleeps forever: always when ``always`` is set, in every Ray actor
    (never in the driver) when ``in_actors`` is, else once in each of the first ``times`` processes
    other than ``driver_pid`` (rollout actors') to claim a ``marker`` file (``marker``, ``marker.1``, ...)."""

    def __init__(
        self,
        marker: str = "",
        driver_pid: int = 0,
        always: bool = False,
        in_actors: bool = False,
        times: int = 1,
        **kwargs,
    ) -> None:
        import os
        import time

        claimed = (
            os.getpid() != driver_pid and marker and any(_claim(marker + (f".{k}" if k else "")) for k in range(times))
        )
        if always or (in_actors and _in_ray_actor()) or claimed:
            while True:
                time.sleep(3600)
        super().__init__(gym.make("CartPole-v1", **kwargs))


def _in_ray_actor() -> bool:
    import sys

    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


def _claim(path: str) -> bool:
    import os

    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True
