"""What an algorithm checks about its env before it builds anything: the env's spaces (one
Gymnasium env, or a ``multi_agent`` section's agents), that its preprocessing, memory, model
size and ``normalize`` section fit them, and the running statistics that section keeps."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from shoal.config import AlgorithmConfig, env_spec_to_str
from shoal.envs import env_info
from shoal.envs.atari import check_preprocessing_applies
from shoal.envs.make import check_env_memory
from shoal.envs.normalize import RunningStats, check_normalize_applies
from shoal.errors import ConfigError, EnvError
from shoal.models.catalog import check_model_size
from shoal.runtime.signals import time_limit


@contextlib.contextmanager
def naming_env(config: AlgorithmConfig):
    """A ConfigError or EnvError about the env's spaces names the env when it does not already."""
    try:
        yield
    except (ConfigError, EnvError) as e:
        name = env_spec_to_str(config.env)
        if type(e) not in (ConfigError, EnvError) or name in str(e) or "space" not in str(e):
            raise
        raise type(e)(f"With env '{name}': {e}") from None


def describe_gym_env(config) -> Any:
    """A single-agent config's env: its spaces and spec facts, after checking that its
    preprocessing applies (what an algorithm and ``shoal.load_policy`` both read)."""
    check_preprocessing_applies(config.env, config.env_preprocessing)
    return env_info(config.env, config.env_config, config.env_preprocessing)


class EnvBuildTimeout(EnvError):
    """Building the env in the driver did not finish within ``resources.request_timeout_s``."""


@contextlib.contextmanager
def driver_build_time_limit(config: AlgorithmConfig, purpose: str = "to read its spaces") -> Iterator[None]:
    """Raise :class:`EnvBuildTimeout`, naming the env and ``purpose``, when the block (which builds
    the env in the driver) runs past ``resources.request_timeout_s``: a constructor that hangs."""
    limit = config.resources.request_timeout_s
    with time_limit(
        limit,
        lambda: EnvBuildTimeout(
            f"Building env {config.env_name()!r} in the driver ({purpose}) did not finish within "
            f"resources.request_timeout_s={limit:g} s: its constructor hangs (waiting on a file, a server, a "
            "licence?). Fix the env, or raise resources.request_timeout_s if it is only slow."
        ),
    ):
        yield


def describe_within_time_limit(config: AlgorithmConfig, describe) -> Any:
    """``describe()`` (which builds the env in the driver to read its spaces), failing early and
    naming the env when its constructor hangs past ``resources.request_timeout_s`` or its spaces
    do not fit; then the env memory and model size checks, before any env vector or layer exists."""
    with naming_env(config), driver_build_time_limit(config):
        info = describe()
    obs_space = getattr(info, "observation_space", None)
    check_env_memory(config, obs_space)
    check_model_size(getattr(config, "model", None), obs_space)
    return info


def normalization_stats(config: AlgorithmConfig, info: Any, multi_agent: bool) -> RunningStats | None:
    """Empty running statistics for the ``normalize`` section, or None when it is off."""
    if not config.normalize.enabled():
        return None
    if multi_agent:
        raise ConfigError(
            f"normalize is not supported with a multi_agent section ({config.algo}): each "
            "policy sees its own observations. Leave normalize.obs and normalize.reward false."
        )
    from shoal.spaces import preprocess_obs, stack_obs

    space = info.observation_space
    check_normalize_applies(config, space)
    return RunningStats.for_config(config, preprocess_obs(space, stack_obs([space.sample()])).shape[1:])
