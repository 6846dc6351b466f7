"""Atari (ALE) envs with DeepMind's standard preprocessing, from either of two back ends.

- ``ale_vector``: ale-py's own vector env. Emulation, frame skip, max-pooling, resizing,
  grayscale, no-op starts and frame stacking all run in C++ threads.
- ``gymnasium``: ``gym.make(id, frameskip=1)`` wrapped in Gymnasium's ``AtariPreprocessing``
  and ``FrameStackObservation``, in a sync vector env (needs opencv for the resize).

Both give ``Box(0, 255, (frame_stack, screen_size, screen_size), uint8)`` observations and
next-step autoreset, and neither clips rewards nor ends episodes on a lost life: the rollout
code does that for the learning signal only (:class:`LearningSignal`), so the returns it
reports are whole-game scores.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from shoal.errors import ConfigError, EnvError

ALE_ENTRY_POINT = "ale_py.env:AtariEnv"
INSTALL_HINT = "Atari envs need the atari extra: pip install 'shoal[atari]'"


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


def missing_ale_error(env_id: str) -> EnvError | None:
    """The error for an ALE-looking id when ale-py is not installed, else None."""
    if env_id.startswith("ALE/") and not register_ale():
        return EnvError(f"Env '{env_id}' is an Atari game. {INSTALL_HINT}")
    return None


def check_preprocessing_applies(env: Any, preprocessing) -> None:
    """Changing ``env_preprocessing`` keys from their defaults for an env that is not an ALE game is an error."""
    if preprocessing is None:
        return
    defaults = type(preprocessing)()
    changed = sorted(k for k in type(preprocessing).model_fields if getattr(preprocessing, k) != getattr(defaults, k))
    if changed and not is_ale_id(env):  # a checkpoint's config lists every key: only changed ones count
        keys = ", ".join(f"env_preprocessing.{k}" for k in changed)
        raise ConfigError(f"{keys} set, but env {env!r} is not an Atari (ALE) game: env_preprocessing applies "
                          "only to ALE ids such as 'ALE/Pong-v5'.")


def _spec_kwargs(env_id: str, preprocessing, env_config: dict[str, Any]) -> dict[str, Any]:
    """The ALE constructor arguments: the id's own, then env_config, then the preprocessing keys."""
    kw = {**gym.spec(env_id).kwargs, **env_config}
    if preprocessing.repeat_action_probability is not None:
        kw["repeat_action_probability"] = preprocessing.repeat_action_probability
    if preprocessing.max_episode_frames is not None:
        kw["max_num_frames_per_episode"] = preprocessing.max_episode_frames
    return kw


def make_atari_env(env_id: str, preprocessing, env_config: dict[str, Any] | None = None, **make_kwargs: Any) -> gym.Env:
    """One preprocessed env through Gymnasium's wrappers (also the rendering path)."""
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    p = preprocessing
    kw = _spec_kwargs(env_id, p, dict(env_config or {}))
    kw.pop("game", None)
    kw["frameskip"] = 1  # the wrapper skips, and max-pools the last two frames of each skip
    try:
        env = gym.make(env_id, **{**kw, **make_kwargs})
        env = AtariPreprocessing(env, noop_max=p.noop_max, frame_skip=p.frame_skip, screen_size=p.screen_size,
                                 terminal_on_life_loss=False, grayscale_obs=True, scale_obs=False)
    except gym.error.DependencyNotInstalled as e:
        raise EnvError(f"{e}. {INSTALL_HINT}") from None
    return FrameStackObservation(env, p.frame_stack)


def make_atari_vec_env(env_id: str, num_envs: int, preprocessing, env_config: dict[str, Any] | None = None
                       ) -> gym.vector.VectorEnv:
    """``num_envs`` preprocessed envs from the configured back end, with next-step autoreset."""
    p = preprocessing
    if p.resolved_backend() == "gymnasium":
        make = lambda: make_atari_env(env_id, p, env_config)  # noqa: E731
        make()  # a bad env_config fails here, with a clear error, not inside the vector env
        return gym.vector.SyncVectorEnv([make] * num_envs, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    from ale_py.vector_env import AtariVectorEnv

    kw = _spec_kwargs(env_id, p, dict(env_config or {}))
    game = kw.pop("game")
    if kw.pop("frameskip", 1) not in (1, 4) or kw.pop("obs_type", "rgb") != "rgb":
        raise EnvError(f"env_config for {env_id!r}: the ale_vector back end sets frame skip and observation type "
                       "from env_preprocessing; use backend gymnasium for other settings")
    kw.pop("mode", None), kw.pop("difficulty", None)
    try:
        return AtariVectorEnv(
            game, num_envs, num_threads=p.num_threads, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
            img_height=p.screen_size, img_width=p.screen_size, grayscale=True, stack_num=p.frame_stack,
            frameskip=p.frame_skip, maxpool=p.max_pool, noop_max=p.noop_max, episodic_life=False,
            reward_clipping=False, use_fire_reset=False, **kw)
    except TypeError as e:
        raise EnvError(f"Cannot build {env_id!r} with env_config {env_config or {}}: {e}") from None


class LearningSignal:
    """Reward clipping and end-of-life terminals for learning, leaving reported scores raw.

    ``apply`` takes one vector step's raw rewards and terminals and returns what the learner
    should see: ``sign(reward)`` with ``clip_rewards``; with ``episodic_life`` a step on which a
    sub-env lost a life (its ``lives`` count fell, the game not over) is marked terminated so
    no value bootstraps across it. The game goes on, so the episode return keeps counting.
    """

    def __init__(self, clip_rewards: bool, episodic_life: bool) -> None:
        self.clip_rewards, self.episodic_life = clip_rewards, episodic_life
        self._lives: np.ndarray | None = None

    @classmethod
    def for_config(cls, config) -> "LearningSignal | None":
        """The signal for an Atari run, None for any other env (nothing to change)."""
        if not is_ale_id(config.env):
            return None
        p = config.env_preprocessing
        return cls(p.clip_rewards, p.episodic_life) if (p.clip_rewards or p.episodic_life) else None

    def start(self, info: dict[str, Any]) -> None:
        """Remember the lives after a reset."""
        self._lives = np.asarray(info["lives"]).copy() if "lives" in info else None

    def apply(self, rewards: np.ndarray, terminateds: np.ndarray, info: dict[str, Any]
              ) -> tuple[np.ndarray, np.ndarray]:
        if self.clip_rewards:
            rewards = np.sign(rewards)
        if self.episodic_life and "lives" in info:
            lives = np.asarray(info["lives"])
            if self._lives is not None:
                lost = (lives < self._lives) & ~terminateds
                if lost.any():
                    terminateds = terminateds | lost
            self._lives = lives.copy()
        return rewards, terminateds
