"""Env construction: Gymnasium ids, import paths or callables, single or vectorized."""

from shoal.envs.make import EnvInfo, env_info, make_env, make_vec_env, resolve_env_creator
from shoal.envs.stateless_cartpole import register as _register_stateless_cartpole

_register_stateless_cartpole()

__all__ = ["EnvInfo", "env_info", "make_env", "make_vec_env", "resolve_env_creator"]
