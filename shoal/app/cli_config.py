"""How `shoal train`'s arguments become a run: the config (defaults, small-machine preset,
config file, --set overrides, flags) and the stop criteria (the file's, the --stop-* flags, the
env's reward threshold)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional

from shoal.errors import ConfigError, EnvError, ShoalError

STOP_KEYS = ("reward", "env_steps", "time_s", "iterations")


def _build_config(algo: Optional[str], config_file: Optional[Path], sets: List[str], flags: dict[str, Any]):
    """defaults < small-machine preset (only when no resources are given) < YAML file < --set < explicit flags.
    ``algo`` None: the config file's ``algo:``.

    Returns (config, stop-from-yaml, preset note or None).
    """
    from shoal.algorithms import get_config_class
    from shoal.config import deep_merge, load_yaml, parse_set_overrides

    data: dict[str, Any] = load_yaml(config_file) if config_file else {}
    yaml_stop = data.pop("stop", None) or {}
    yaml_algo = data.pop("algo", None)
    if algo is None:
        if yaml_algo is None:
            raise ConfigError(
                "No algorithm given: name it (shoal train ppo ...; `shoal algos` lists them)"
                + (f", or add a line `algo: ppo` to '{config_file}'." if config_file else ".")
            )
        algo = str(yaml_algo)
    cfg_cls = get_config_class(algo)
    if yaml_algo is not None and yaml_algo != cfg_cls.algo:
        raise ShoalError(
            f"Config file '{config_file}' is for algorithm '{yaml_algo}', but you asked to train '{algo}'."
        )
    if not isinstance(yaml_stop, dict) or set(yaml_stop) - set(STOP_KEYS):
        raise ShoalError(
            f"Config file '{config_file}': `stop` must be a mapping with keys among {', '.join(STOP_KEYS)}."
        )
    data = deep_merge(data, parse_set_overrides(sets))
    data = deep_merge(data, {k: v for k, v in flags.items() if v is not None and k != "resources"})
    res = {k: v for k, v in flags.get("resources", {}).items() if v is not None}
    if res:
        data = deep_merge(data, {"resources": res})
    preset = cfg_cls.small_machine_preset()
    note = None
    if preset is not None and "resources" not in data:
        # No resources given at all: start from the algorithm's small-machine preset (e.g. Ape-X).
        note = _preset_note(cfg_cls, preset, data)
        data = deep_merge(preset, data)
    if "env" not in data:
        raise ShoalError("No env given: pass --env (e.g. --env CartPole-v1) or set `env:` in a config file.")
    return cfg_cls(**data), yaml_stop, note


def _preset_note(cfg_cls, preset: dict[str, Any], given: dict[str, Any]) -> str:
    """One line: the preset is used, the settings it changes from the defaults, and how to opt out.

    A preset key the user also gave is left out (the user's value wins), and so is one whose
    value is the default anyway: what remains is exactly what the preset changes.
    """
    user = _dotted(given)
    changes = [f"{k}={v}" for k, v in _dotted(preset).items() if k not in user and v != _default(cfg_cls, k)]
    return (
        f"No resources given: starting from {cfg_cls.__name__}.small_machine_preset(), which changes "
        f"{', '.join(changes) or 'nothing'} from the defaults. Give any resources setting (--workers, "
        "--envs-per-worker, --set resources.KEY=VALUE or a `resources:` section) to start from the defaults instead."
    )


def _dotted(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"resources": {"num_workers": 2}}`` -> ``{"resources.num_workers": 2}``."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_dotted(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def _default(model, dotted: str) -> Any:
    """The default of a dotted config key (``resources.num_workers``), reaching into sections."""
    head, _, rest = dotted.partition(".")
    value = model.model_fields[head].get_default(call_default_factory=True)
    return _default(type(value), rest) if rest else value


def _reward_threshold(cfg) -> Optional[float]:
    """The env's reward threshold (its Gymnasium spec's), or None when it has none.

    A multi-agent (PettingZoo) env is no Gymnasium env and has none: for an algorithm that
    checks its env its own way (alpha_star, a multi_agent section) a failure here gives None,
    and building the algorithm reports a bad env. For any other a bad env is reported now,
    before any note about the stop criteria.

    A registered Gymnasium id's threshold is read from its spec, without building the env (building
    the algorithm checks the env next). Anything else is built under the time limit the
    algorithm's own build uses: a constructor that hangs ends the run with a message, not silently.
    """
    import gymnasium as gym

    from shoal.envs import env_info
    from shoal.envs.atari import is_ale_id
    from shoal.framework.base import Algorithm
    from shoal.framework.env_checks import EnvBuildTimeout, driver_build_time_limit

    if isinstance(cfg.env, str) and cfg.env in gym.envs.registry and not is_ale_id(cfg.env):
        return gym.spec(cfg.env).reward_threshold
    algorithm_cls = type(cfg).algorithm_cls
    gymnasium_env = (
        getattr(cfg, "multi_agent", None) is None
        and algorithm_cls is not None
        and algorithm_cls.describe_env is Algorithm.describe_env
    )
    try:
        with driver_build_time_limit(cfg, "to read its reward threshold"):
            return env_info(cfg.env, cfg.env_config, cfg.env_preprocessing).reward_threshold
    except EnvBuildTimeout:
        raise  # the algorithm's build would hang on it again
    except EnvError:
        if gymnasium_env:
            raise
        return None


def _train_stop(cfg: Any, yaml_stop: dict[str, Any], flags: dict[str, Any], no_stop_reward: bool) -> Any:
    """shoal train's stop criteria: the config file's, overridden by --stop-* flags, and the env's reward
    threshold unless a reward is given or --no-stop-reward says none."""
    from shoal.app.stop_criteria import _as_stop

    if no_stop_reward and flags["reward"] is not None:
        raise ConfigError(
            f"--stop-reward {flags['reward']:g} and --no-stop-reward contradict each other; give one of them."
        )
    stop_d = {**yaml_stop, **{k: v for k, v in flags.items() if v is not None}}
    if no_stop_reward:
        stop_d.pop("reward", None)
    elif stop_d.get("reward") is None:
        stop_d["reward"] = _reward_threshold(cfg)
    return _as_stop(stop_d)  # a bad value is a ConfigError (exit 2), not a traceback
