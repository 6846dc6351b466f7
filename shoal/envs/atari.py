"""Atari (ALE) envs with DeepMind's standard preprocessing, from either of two back ends.

- ``ale_vector``: ale-py's own vector env. Emulation, frame skip, max-pooling, resizing,
  grayscale, no-op starts and frame stacking all run in C++ threads.
- ``gymnasium``: ``gym.make(id, frameskip=1)`` wrapped in Gymnasium's ``AtariPreprocessing``
  and ``FrameStackObservation``, in a sync vector env (needs opencv for the resize).

Both give ``Box(0, 255, (frame_stack, screen_size, screen_size), uint8)`` observations and
next-step autoreset, and neither clips rewards nor ends episodes on a lost life: the rollout
code does that for the learning signal only (:class:`LearningSignal`), so the returns it
reports are whole-game scores.

Games that wait for FIRE to serve or launch (those whose action 1 is FIRE, Breakout among
them) get it pressed for them with ``fire_reset``: :class:`FireReset` on the ``gymnasium`` back
end, :class:`VectorFireReset` on ``ale_vector``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from shoal.errors import ConfigError, EnvError
from shoal.gym_ids import is_ale_id, register_ale

INSTALL_HINT = "Atari envs need the atari extra: pip install -e '.[atari]' in the shoal checkout"


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
        raise ConfigError(
            f"{keys} set, but env {env!r} is not an Atari (ALE) game: env_preprocessing applies "
            "only to ALE ids such as 'ALE/Pong-v5'."
        )


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
        env = AtariPreprocessing(
            env,
            noop_max=p.noop_max,
            frame_skip=p.frame_skip,
            screen_size=p.screen_size,
            terminal_on_life_loss=False,
            grayscale_obs=True,
            scale_obs=False,
        )
    except gym.error.DependencyNotInstalled as e:
        raise EnvError(f"{e}. {INSTALL_HINT}") from None
    if fire_reset_on(env_id, p.fire_reset, env.action_space, env.unwrapped.get_action_meanings()):
        env = FireReset(env)
    return FrameStackObservation(env, p.frame_stack)


def make_atari_vec_env(
    env_id: str, num_envs: int, preprocessing, env_config: dict[str, Any] | None = None
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
        raise EnvError(
            f"env_config for {env_id!r}: the ale_vector back end sets frame skip and observation type "
            "from env_preprocessing; use backend gymnasium for other settings"
        )
    kw.pop("mode", None), kw.pop("difficulty", None)
    try:  # ale-py's own use_fire_reset presses FIRE for one frame at resets only: VectorFireReset does it here
        vec = AtariVectorEnv(
            game,
            num_envs,
            num_threads=p.num_threads,
            autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
            img_height=p.screen_size,
            img_width=p.screen_size,
            grayscale=True,
            stack_num=p.frame_stack,
            frameskip=p.frame_skip,
            maxpool=p.max_pool,
            noop_max=p.noop_max,
            episodic_life=False,
            reward_clipping=False,
            use_fire_reset=False,
            **kw,
        )
    except TypeError as e:
        raise EnvError(f"Cannot build {env_id!r} with env_config {env_config or {}}: {e}") from None
    meanings = [a.name for a in vec.ale.get_action_set()]
    return VectorFireReset(vec) if fire_reset_on(env_id, p.fire_reset, vec.single_action_space, meanings) else vec


FIRE, AFTER_FIRE = 1, 2  # a game's start, as DeepMind's wrappers play it: FIRE, then action 2


def fire_reset_on(env_id: str, setting: Any, action_space: gym.Space, meanings: list[str]) -> bool:
    """Whether ``env_preprocessing.fire_reset`` (``setting``) presses FIRE for this game.

    ``auto`` does for games whose action 1 is FIRE among at least three actions (Breakout, Pong,
    Space Invaders; not Ms. Pac-Man or Freeway); ``true`` for a game without that is an error.
    """
    fires = isinstance(action_space, gym.spaces.Discrete) and len(meanings) >= 3 and meanings[1] == "FIRE"
    if setting is True and not fires:
        raise EnvError(
            f"env_preprocessing.fire_reset is true, but action 1 of {env_id!r} is not FIRE (its actions: "
            f"{', '.join(meanings)}); set fire_reset to auto or false"
        )
    return fires if setting == "auto" else bool(setting)


class FireReset(gym.Wrapper):
    """Presses FIRE for a game that waits for it, at the start of each game and after each lost life.

    ``reset`` plays FIRE and then action 2 before returning the first observation, resetting
    again if either ends the game (those two steps and their rewards belong to no episode).
    After a step that loses a life, the game going on, the next step plays FIRE in place of
    the action given, so the ball is relaunched even by a policy that never fires.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._lives = 0
        self._fire_next = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        for action in (FIRE, AFTER_FIRE):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:  # the seed is spent: this reset carries on from it
                obs, info = self.env.reset(options=options)
        self._lives, self._fire_next = info["lives"], False
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(FIRE if self._fire_next else action)
        self._fire_next = info["lives"] < self._lives and not (terminated or truncated)
        self._lives = info["lives"]
        return obs, reward, terminated, truncated, info


class VectorFireReset(gym.vector.VectorWrapper):
    """:class:`FireReset` for a vector env whose sub-envs cannot be stepped one at a time (ale-py's).

    The presses take the place of actions given, in the sub-env's own steps: its first two
    actions of each game are FIRE and action 2, and its first action after a lost life is FIRE.
    A game that ends during them starts again with FIRE and action 2 (next-step autoreset).
    """

    NONE = -1  # no forced action: the one given is played

    def __init__(self, env: gym.vector.VectorEnv) -> None:
        super().__init__(env)
        n = env.num_envs
        self._forced = np.full((n, 2), self.NONE, np.int64)  # per sub-env: its next forced actions, in order
        self._lives = np.zeros(n, np.int64)
        self._resets_next = np.zeros(n, bool)  # ended last step: the next step resets it and ignores its action

    def reset(self, *, seed=None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        mask = (options or {}).get("reset_mask", np.ones(self.num_envs, bool))
        self._forced[mask] = (FIRE, AFTER_FIRE)
        self._lives[mask] = np.asarray(info["lives"])[mask]
        self._resets_next[mask] = False
        return obs, info

    def step(self, actions):
        forced = self._forced[:, 0].copy()
        actions = np.where(forced != self.NONE, forced, actions).astype(np.asarray(actions).dtype)
        self._forced[:, 0] = self._forced[:, 1]
        self._forced[:, 1] = self.NONE
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        lives, ended = np.asarray(info["lives"]), terminated | truncated
        self._forced[(lives < self._lives) & ~ended] = (FIRE, self.NONE)
        self._forced[ended] = self.NONE
        self._forced[self._resets_next] = (FIRE, AFTER_FIRE)  # these sub-envs started a game on this step
        self._lives, self._resets_next = lives.astype(np.int64), ended
        return obs, rewards, terminated, truncated, info


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

    def apply(
        self, rewards: np.ndarray, terminateds: np.ndarray, info: dict[str, Any]
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
