"""Gymnasium ids of ALE games: a leaf module (gymnasium only), so that checks on a config's env
id (``shoal.trust``) need not import the env package."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

ALE_ENTRY_POINT = "ale_py.env:AtariEnv"


def register_ale() -> bool:
    """Register ale-py's ids with Gymnasium; False when ale-py is not installed."""
    try:
        import ale_py
    except ImportError:
        return False
    gym.register_envs(ale_py)
    return True


def looks_like_ale(env_id: str) -> bool:
    """Ids ale-py registers: ``ALE/Game-v5`` and the older ``GameNoFrameskip-v4`` forms."""
    return env_id.startswith("ALE/") or env_id.endswith("-v4")  # v4: Pong-v4, PongNoFrameskip-v4, ...


def is_ale_id(env: Any) -> bool:
    """Whether ``env`` is a Gymnasium id of an ALE game (registering ale-py's ids when needed)."""
    if not isinstance(env, str):
        return False
    if env not in gym.envs.registry and looks_like_ale(env):
        register_ale()
    spec = gym.envs.registry.get(env)
    return spec is not None and spec.entry_point == ALE_ENTRY_POINT
