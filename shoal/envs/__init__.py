"""Env construction: Gymnasium ids, import paths or callables, single or vectorized."""

from shoal.envs.make import EnvInfo, env_info, make_env, make_vec_env, resolve_env_creator

__all__ = ["EnvInfo", "env_info", "make_env", "make_vec_env", "resolve_env_creator"]
