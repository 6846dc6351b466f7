"""Field types configs share: piecewise-linear schedules (``lr_schedule``,
``entropy_coeff_schedule``) and env specs (a Gymnasium id, an import path or a callable),
with the names a run gives an env spec."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Callable, Optional, Union

from pydantic import AfterValidator, BeforeValidator, Field


def _schedule_points(key: str, value: str) -> Callable[[Any], Any]:
    """Before validation: each point of schedule ``key`` is a pair [env_steps, ``value``]."""

    def check(v: Any) -> Any:
        for i, point in enumerate(v if isinstance(v, (list, tuple)) else []):
            if not isinstance(point, (list, tuple)) or len(point) != 2:
                raise ValueError(
                    f"{key}[{i}] is {point!r}; each point is [env_steps, {value}], e.g. [[0, 0.001], [100000, 0.0001]]"
                )
        return v

    return check


def _schedule_order(key: str, value: str) -> Callable[[Any], Any]:
    """After validation: at least one point, env steps increasing from >= 0, values finite and >= 0."""

    def check(v: Any) -> Any:
        if v is not None:
            if not v:
                raise ValueError(f"{key} needs at least one [env_steps, {value}] point")
            steps = [s for s, _ in v]
            if steps != sorted(steps) or steps[0] < 0:
                raise ValueError(f"{key} points must have non-negative, increasing env_steps")
            if any(not (0 <= y < math.inf) for _, y in v):
                raise ValueError(f"{key} values must be finite numbers >= 0")
        return v

    return check


# piecewise-linear schedules over sampled env steps, [[env_steps, value], ...] or None
LRSchedule = Annotated[
    Optional[list[tuple[int, float]]],
    BeforeValidator(_schedule_points("lr_schedule", "lr")),
    AfterValidator(_schedule_order("lr_schedule", "lr")),
]
EntropySchedule = Annotated[  # the key of every config with an entropy bonus (PPO's and V-trace's groups)
    Optional[list[tuple[int, float]]],
    BeforeValidator(_schedule_points("entropy_coeff_schedule", "entropy_coeff")),
    AfterValidator(_schedule_order("entropy_coeff_schedule", "entropy_coeff")),
    Field(
        description="Piecewise-linear [[env_steps, entropy_coeff], ...] over sampled env steps; overrides "
        "entropy_coeff when set."
    ),
]

EnvSpec = Union[str, Callable[..., Any]]


# ---- env specs -------------------------------------------------------------------------
def env_spec_to_str(env: EnvSpec) -> str:
    if isinstance(env, str):
        return env
    mod, qual = getattr(env, "__module__", None), getattr(env, "__qualname__", None)
    if mod and qual and "<" not in qual:
        return f"{mod}:{qual}"
    return repr(env)


GENERIC_FACTORY_NAMES = frozenset({"make", "make_env", "env", "parallel_env", "raw_env", "create", "build"})
"""Factory names that say nothing of the env: an import path's name then leads with what holds it."""


def env_spec_name(env: EnvSpec) -> str:
    """A short name for run directories and titles: the Gymnasium id (``ALE/Pong-v5`` ->
    ``ALE_Pong-v5``), or the function or class name of an import path or callable
    (``my_pkg.envs:make_maze`` -> ``make_maze``; a lambda is ``lambda``, a ``functools.partial``
    its function's name). An import path to a generic factory (:data:`GENERIC_FACTORY_NAMES`)
    leads with the part before it: ``my_pkg.envs:make`` -> ``envs-make``,
    ``pettingzoo.classic.rps_v2:parallel_env`` -> ``rps_v2-parallel_env``."""
    if isinstance(env, str):
        name = env
        if ":" in env:
            module, _, attr = env.partition(":")
            *holders, name = [*module.split("."), *attr.split(".")]
            if name in GENERIC_FACTORY_NAMES and holders and holders[-1]:
                name = f"{holders[-1]}-{name}"
    else:
        target = getattr(env, "func", env)  # functools.partial
        name = getattr(target, "__name__", None) or type(target).__name__
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", name.replace("<lambda>", "lambda"))
    return name or "env"
