"""Env construction: Gymnasium ids, import paths or callables, single or vectorized.

The construction functions load on first use (PEP 562), so importing a leaf module such as
``shoal.envs.atari`` does not import the config layer behind ``shoal.envs.make``.
"""

from typing import Any

from shoal.envs.stateless_cartpole import register as _register_stateless_cartpole

_register_stateless_cartpole()

__all__ = ["EnvInfo", "env_info", "make_env", "make_vec_env", "resolve_env_creator"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from shoal.envs import make

        return getattr(make, name)
    raise AttributeError(f"module 'shoal.envs' has no attribute {name!r}")
