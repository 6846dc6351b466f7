"""Building envs from a config's ``env`` entry.

``env`` is one of: a registered Gymnasium id (``"CartPole-v1"``); an import path to a
callable (``"my_pkg.envs:make_maze"``) called with ``env_config`` as keyword arguments; or
the callable itself. Vectorized envs always use Gymnasium's next-step autoreset: the step
after an episode ends returns the reset observation, its action is ignored and it carries no
transition. EnvRunners rely on that layout (the final observation of an episode is the
observation returned by its last step, so its value is at hand for bootstrapping).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable

import gymnasium as gym

from shoal.config import EnvPreprocessingConfig, EnvSpec
from shoal.envs.atari import is_ale_id, make_atari_env, make_atari_vec_env, missing_ale_error
from shoal.errors import ConfigError, EnvError
from shoal.imports import import_path
from shoal.spaces import flat_obs_dim, given_mask_width, obs_nbytes  # noqa: F401  (re-exported)
from shoal.trust import check_import


def _unknown_env(env_id: str) -> EnvError:
    missing = missing_ale_error(env_id)
    if missing is not None:
        return missing
    ids = list(gym.envs.registry.keys())
    close = difflib.get_close_matches(env_id, ids, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return EnvError(
        f"Unknown env '{env_id}'.{hint} `env` must be a registered Gymnasium id (e.g. 'CartPole-v1'), "
        "an import path 'package.module:make_env' to a callable returning an env, or the callable itself."
    )


def _pettingzoo_env(env: EnvSpec) -> EnvError:
    return EnvError(
        f"Env {env!r} is a PettingZoo (multi-agent) env, not a Gymnasium one: a single-agent "
        "algorithm cannot train it. Give ppo, impala or appo a multi_agent section (see "
        "docs/guide/multi-agent.md), or train alpha_star on a two-player game."
    )


def _is_pettingzoo_env(obj: Any) -> bool:
    """A PettingZoo AECEnv or ParallelEnv (or a wrapper of one); pettingzoo is imported only when
    something has imported it already (an env that is one of its classes has)."""
    import sys

    pz = sys.modules.get("pettingzoo.utils.env")
    return pz is not None and isinstance(obj, (pz.AECEnv, pz.ParallelEnv))


def resolve_env_creator(env: EnvSpec, env_config: dict[str, Any] | None = None) -> Callable[..., gym.Env]:
    """A zero-argument-ish creator: ``creator(**extra_kwargs) -> gym.Env``. Raises EnvError early."""
    env_config = dict(env_config or {})
    if callable(env):
        return lambda **kw: env(**{**env_config, **kw})
    if not isinstance(env, str) or not env:
        raise EnvError(f"`env` must be a Gymnasium id, an import path or a callable, got {env!r}.")
    if env in gym.envs.registry or is_ale_id(env):
        return lambda **kw: gym.make(env, **{**env_config, **kw})
    if ":" in env:
        mod, _, attr = env.partition(":")
        if not mod.strip() or not attr.strip():
            raise EnvError(
                f"Env '{env}' is not an import path: 'package.module:make_env' needs a module before the "
                "colon and a name after it (or give a registered Gymnasium id such as 'CartPole-v1')."
            )
        try:
            obj = import_path(env)
        except (ImportError, AttributeError) as e:
            # Gymnasium's own "module:EnvId" form registers ids on import.
            try:
                import importlib

                check_import(env)
                importlib.import_module(mod)
            except ImportError:
                raise EnvError(f"Cannot import env '{env}': {e}.") from None
            if attr in gym.envs.registry:
                return lambda **kw: gym.make(attr, **{**env_config, **kw})
            raise EnvError(f"Cannot import env '{env}': {e}.") from None
        if not callable(obj):
            if any(callable(getattr(obj, f, None)) for f in ("env", "parallel_env")):
                raise _pettingzoo_env(env)
            raise EnvError(f"Env import path '{env}' names {type(obj).__name__}, which is not callable.")
        return lambda **kw: obj(**{**env_config, **kw})
    raise _unknown_env(env)


def make_env(
    env: EnvSpec,
    env_config: dict[str, Any] | None = None,
    seed: int | None = None,
    preprocessing: EnvPreprocessingConfig | None = None,
    **kwargs,
) -> gym.Env:
    """One env; an ALE id gets the Atari preprocessing (``preprocessing``, or the defaults)."""
    if is_ale_id(env):
        creator = lambda **kw: make_atari_env(env, preprocessing or EnvPreprocessingConfig(), env_config, **kw)  # noqa: E731
    else:
        creator = resolve_env_creator(env, env_config)
    try:
        e = creator(**kwargs)
    except gym.error.Error as err:
        raise EnvError(f"Cannot build env {env!r}: {err}") from None
    except TypeError as err:
        # Almost always a keyword in env_config that the constructor does not take.
        raise EnvError(
            f"Cannot build env {env!r} with env_config {env_config or {}}: {err}. "
            "Check the env_config keys against the env's constructor."
        ) from err
    except Exception as err:  # noqa: BLE001 - the user's factory failed: report its own error, no traceback
        if isinstance(err, EnvError):
            raise
        raise EnvError(
            f"Cannot build env {env!r}: creating it raised {type(err).__name__}: {err}. The env (or the "
            "factory `env` names) must build with the given env_config; fix it, or check env_config."
        ) from err
    if not isinstance(e, gym.Env):
        if _is_pettingzoo_env(e):  # 'pkg.module:parallel_env' or ':env', the module's factory functions
            e.close()
            raise _pettingzoo_env(env)
        raise EnvError(f"The env creator for {env!r} returned {type(e).__name__}, not a gymnasium.Env.")
    if seed is not None:
        e.reset(seed=seed)
        e.action_space.seed(seed)
    return e


def make_vec_env(
    env: EnvSpec,
    num_envs: int,
    env_config: dict[str, Any] | None = None,
    seed: int | None = None,
    preprocessing: EnvPreprocessingConfig | None = None,
) -> gym.vector.VectorEnv:
    """A vector env with next-step autoreset, seeded with ``seed`` (sub-env i gets ``seed + i``).

    A registered id with a vectorized entry point (CartPole, ...) uses it: far faster than N
    wrapped single envs. An ALE id gets the Atari preprocessing from the back end that
    ``preprocessing`` (or its defaults) names.
    """
    env_config = dict(env_config or {})
    vec: gym.vector.VectorEnv
    if is_ale_id(env):
        vec = make_atari_vec_env(env, num_envs, preprocessing or EnvPreprocessingConfig(), env_config)
    elif isinstance(env, str) and env in gym.envs.registry and gym.spec(env).vector_entry_point is not None:
        vec = gym.make_vec(env, num_envs=num_envs, vectorization_mode="vector_entry_point", **env_config)
    else:
        creator = resolve_env_creator(env, env_config)
        make_env(env, env_config)  # build one now so a bad env fails here, with a clear error
        vec = gym.vector.SyncVectorEnv(
            [creator for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP
        )
    mode = vec.metadata.get("autoreset_mode", gym.vector.AutoresetMode.NEXT_STEP)
    if mode != gym.vector.AutoresetMode.NEXT_STEP:
        raise EnvError(f"Env {env!r} vectorizes with autoreset mode {mode}; shoal needs next-step autoreset.")
    vec.reset(seed=seed)
    if seed is not None:
        vec.action_space.seed(seed)
    return vec


ENV_OVERHEAD_BYTES = 64 * 1024  # a floor for one env object and its vector-env buffers, observations aside


def check_env_memory(config: Any, obs_space: gym.Space | None) -> None:
    """ConfigError, before any env is built, when what a config asks for cannot fit in memory.

    Each rollout process (the driver, or each of ``num_workers`` actors on one machine at worst)
    holds ``num_envs_per_worker`` envs (at least :data:`ENV_OVERHEAD_BYTES` each) and fragments of
    ``fragment_length()`` steps of their observations; the learner holds ``train_batch_size`` rows.
    The message names the key that asks for the most. No check where the available memory cannot be read.
    """
    from shoal import process
    from shoal.process import GB

    res, row = config.resources, 4 * obs_nbytes(obs_space) + 64  # obs, next obs, copies; a few scalars
    processes = max(1, res.num_workers)
    frag = config.fragment_length()
    batch = f"train_batch_size={getattr(config, 'train_batch_size', 0)}"
    # an 'auto' fragment length is derived from train_batch_size: that is the key to name
    frag_key = (
        f"rollout_fragment_length={frag}"
        if isinstance(getattr(config, "rollout_fragment_length", None), int)
        else batch
    )
    asks = {
        f"resources.num_envs_per_worker={res.num_envs_per_worker}": processes
        * res.num_envs_per_worker
        * ENV_OVERHEAD_BYTES,
        frag_key: 0,
        batch: 0,
    }
    asks[frag_key] += processes * res.num_envs_per_worker * (frag + 1) * row
    asks[batch] += getattr(config, "train_batch_size", 0) * row
    needed, avail = sum(asks.values()), process.available_memory_bytes()
    if avail is None or needed <= avail:
        return
    culprit = max(asks, key=asks.get)
    raise ConfigError(
        f"{culprit} is too large for this machine: the run needs about {needed / GB:,.1f} GB for its "
        f"envs and batches ({processes} rollout process{'es' if processes > 1 else ''} of "
        f"{res.num_envs_per_worker} envs, {row:,} bytes per step), and this machine has {avail / GB:.1f} GB "
        "available. Lower it (typical: 1 to 64 envs per worker, batches of thousands of steps); "
        "nothing was built."
    )


@dataclass(frozen=True)
class EnvInfo:
    observation_space: gym.Space
    action_space: gym.Space
    reward_threshold: float | None
    max_episode_steps: int | None


def env_info(
    env: EnvSpec, env_config: dict[str, Any] | None = None, preprocessing: EnvPreprocessingConfig | None = None
) -> EnvInfo:
    """Spaces and spec facts, from one throwaway env (validates the env spec)."""
    if is_ale_id(env):
        vec = make_vec_env(env, 1, env_config, preprocessing=preprocessing)
        try:
            return EnvInfo(vec.single_observation_space, vec.single_action_space, None, None)
        finally:
            vec.close()
    e = make_env(env, env_config)
    try:
        given_mask_width(e.observation_space, e.action_space, _check_reset_api(e, env))  # masks it can take
        spec = e.spec
        return EnvInfo(
            observation_space=e.observation_space,
            action_space=e.action_space,
            reward_threshold=getattr(spec, "reward_threshold", None) if spec else None,
            max_episode_steps=getattr(spec, "max_episode_steps", None) if spec else None,
        )
    finally:
        e.close()


def _check_reset_api(e: gym.Env, env: EnvSpec) -> dict:
    """The first reset's info; an EnvError when ``e.reset()`` answers in the old gym API (before
    0.26: the observation alone). A reset that raises is left to the runners, which recreate failing envs."""
    try:
        out = e.reset()
    except Exception:  # noqa: BLE001 - the runner reports and handles an env that fails
        return {}
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
        raise EnvError(
            f"Env {env!r} follows the old gym API (before 0.26): its reset() returned "
            f"{type(out).__name__}, not (observation, info). shoal needs Gymnasium's API: reset(seed=None, "
            "options=None) -> (obs, info) and step(action) -> (obs, reward, terminated, truncated, info). "
            "Port the env, or wrap it with shimmy's GymV21CompatibilityV0."
        )
    return out[1]
