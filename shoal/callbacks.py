"""User hooks into training: subclass :class:`Callbacks` and override what you need.

A config names the class (``callbacks: "my_pkg.hooks:MyCallbacks"`` in YAML, or the class
itself in Python: ``PPOConfig(env=..., callbacks=MyCallbacks)``). Every process that runs a
hook builds its own instance with no arguments: the driver one, and each rollout runner (in the
driver with ``num_workers=0``, inside each Ray rollout actor otherwise) one more. Instances do
not share state; what a runner's hooks learn reaches the driver only as the metrics
``on_episode_end`` returns.

Per-step cost: a runner calls ``on_episode_step`` only when the class overrides it, and does
its episode bookkeeping only when ``on_episode_step`` or ``on_episode_end`` is overridden, so a
config without callbacks (or with driver-side hooks only) samples exactly as before.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from shoal.errors import ConfigError


@dataclass
class Episode:
    """What the runner knows about one episode of one env, handed to the episode hooks.

    Treat every field but ``user_data`` as read-only: the runner owns them. ``user_data`` is
    yours, empty at the start of each episode, for ``on_episode_step`` to fill and
    ``on_episode_end`` to read.
    """

    env_index: int  # the env's index in the runner's vector (multi-agent: the env copy)
    worker_index: int  # 0: the driver's own runner; 1..N: rollout actor N
    total_return: float = 0.0  # the raw reward summed so far (multi-agent: over all agents)
    length: int = 0  # env steps so far
    info: dict[str, Any] = field(default_factory=dict)  # the last step's info for this env (at the end: the final one)
    user_data: dict[str, Any] = field(default_factory=dict)
    agent_returns: Optional[dict[str, float]] = None  # multi-agent only: each agent's return
    agent_policies: Optional[dict[str, str]] = None  # multi-agent only: the policy id each agent played


class Callbacks:
    """The base class of user callbacks: every method does nothing. Override the ones you need.

    Driver hooks (``on_train_result``, ``on_checkpoint``, ``on_evaluate``) run in the process
    that calls ``train()``. Episode hooks (``on_episode_step``, ``on_episode_end``) run where
    the envs are stepped: in the driver with ``resources.num_workers: 0``, in the Ray rollout
    actors otherwise. The class must be constructible with no arguments.
    """

    def on_train_result(self, algorithm: Any, result: dict[str, Any]) -> None:
        """Driver, at the end of every ``algorithm.train()`` iteration, with the result dict.

        Keys added to ``result`` here are part of the result: the trainer writes them to
        results.jsonl, progress.csv and every logger, and stop criteria see them.
        """

    def on_checkpoint(self, algorithm: Any, path: Any, kind: str) -> None:
        """Driver, once a checkpoint written by ``shoal.train`` is complete on disk.

        ``path`` is the checkpoint directory (a ``pathlib.Path``); ``kind`` is ``"numbered"``
        (every ``checkpoint_every`` iterations), ``"best"`` (``checkpoints/best`` replaced) or
        ``"final"`` (the numbered checkpoint written when training stops, Ctrl-C included).
        ``algorithm.save()`` called directly does not run it.
        """

    def on_evaluate(self, algorithm: Any, result: dict[str, Any]) -> None:
        """Driver, after a periodic evaluation inside ``train()`` (``evaluation.evaluation_interval``).

        ``result`` holds the evaluation figures without their ``evaluation/`` prefix
        (``episode_return_mean``, ``num_episodes``...); keys added here join the iteration's
        result under ``evaluation/``.
        """

    def on_episode_step(self, episode: Episode, obs: Any, reward: float, info: dict[str, Any]) -> None:
        """Rollout runner, after every env step of an episode (the last one included).

        ``obs`` is the observation the step returned, ``reward`` the raw reward and ``info``
        this env's info dict. Record what you need in ``episode.user_data``. Overriding this
        costs a Python call per env per step; leave it alone if ``on_episode_end`` suffices.
        """

    def on_episode_end(self, episode: Episode) -> Optional[dict[str, float]]:
        """Rollout runner, when an episode ends (terminated or truncated); returns custom metrics.

        Return ``{name: number}`` (or None). The runner sends them with its samples and the
        driver reports, in each iteration's result, ``custom/<name>_mean``, ``custom/<name>_min``
        and ``custom/<name>_max`` over the episodes that ended during that iteration and returned
        ``name`` (not a sliding window, unlike ``episode_return_mean``). An iteration in which no
        episode returned ``name`` has no ``custom/<name>_*`` keys. Ape-X reports only the episodes
        of its least exploring third of actors, as for its returns.
        """
        return None


def overrides(callbacks: Callbacks | None, name: str) -> bool:
    """Whether ``callbacks``'s class replaces the base class's method ``name``."""
    return callbacks is not None and getattr(type(callbacks), name) is not getattr(Callbacks, name)


def resolve_callbacks(spec: Any) -> type[Callbacks]:
    """The Callbacks class that ``spec`` (a class or a 'package.module:ClassName' path) names.

    Checks it is a subclass of :class:`Callbacks` that builds with no arguments; raises
    :class:`ValueError` otherwise (the config turns it into a ConfigError naming the key).
    """
    from shoal.imports import import_path

    cls = spec
    if isinstance(spec, str):
        if ":" not in spec and "." not in spec:
            raise ValueError(f"'{spec}' is not an import path; give 'package.module:ClassName'")
        try:
            cls = import_path(spec)
        except (ImportError, AttributeError) as e:
            raise ValueError(
                f"cannot import '{spec}' ({type(e).__name__}: {e}); give 'package.module:ClassName' "
                "of a module on the Python path (the working directory is)"
            ) from None
    if not (inspect.isclass(cls) and issubclass(cls, Callbacks)):
        raise ValueError(f"{spec!r} is not a subclass of shoal.Callbacks")
    try:
        cls()
    except Exception as e:  # noqa: BLE001 - any failure to construct is the user's to fix
        raise ValueError(
            f"{cls.__name__}() failed ({type(e).__name__}: {e}); a Callbacks class must build with no arguments"
        ) from None
    return cls


def callbacks_to_str(spec: Any) -> Optional[str]:
    """The import path a config file stores for ``spec``; None for a class that has none.

    A class defined in ``__main__`` or inside a function works for the run that was given it
    (in-process and on Ray actors, which receive it by value), but no other process can import
    it by name, so config.yaml and checkpoints record no callbacks for it.
    """
    if spec is None or isinstance(spec, str):
        return spec
    mod, qual = spec.__module__, spec.__qualname__
    if mod == "__main__" or "<locals>" in qual:
        return None
    return f"{mod}:{qual}"


def build_callbacks(spec: Any) -> Optional[Callbacks]:
    """An instance of the class ``spec`` names, or None when there is none."""
    if spec is None:
        return None
    try:
        return resolve_callbacks(spec)()
    except ValueError as e:
        raise ConfigError(f"Config key 'callbacks': {e}.") from None


def call_episode_end(callbacks: Callbacks, episode: Episode) -> dict[str, float]:
    """``on_episode_end``'s metrics checked: a dict of finite-or-NaN numbers keyed by name."""
    out = callbacks.on_episode_end(episode)
    if out is None:
        return {}
    if not isinstance(out, dict):
        raise TypeError(
            f"{type(callbacks).__name__}.on_episode_end must return a dict of numbers or None, got {type(out).__name__}"
        )
    try:
        return {str(k): float(v) for k, v in out.items()}
    except (TypeError, ValueError) as e:
        raise TypeError(f"{type(callbacks).__name__}.on_episode_end returned a non-numeric metric: {e}") from None


def aggregate_custom(per_episode: list[dict[str, float]]) -> dict[str, float]:
    """``custom/<name>_mean``, ``_min`` and ``_max`` of each name over the episodes that gave it (NaNs skipped)."""
    values: dict[str, list[float]] = {}
    for metrics in per_episode:
        for k, v in metrics.items():
            values.setdefault(k, [])
            if not math.isnan(v):
                values[k].append(v)
    out = {}
    for k, vs in values.items():
        nan = math.nan
        out[f"custom/{k}_mean"] = sum(vs) / len(vs) if vs else nan
        out[f"custom/{k}_min"] = min(vs) if vs else nan
        out[f"custom/{k}_max"] = max(vs) if vs else nan
    return out


__all__ = [
    "Callbacks",
    "Episode",
    "aggregate_custom",
    "build_callbacks",
    "callbacks_to_str",
    "overrides",
    "resolve_callbacks",
]
