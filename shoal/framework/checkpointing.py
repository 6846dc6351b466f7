"""An algorithm's checkpoints: what ``meta.json`` says of a run, loading a state into a built
algorithm with a clear error when it does not fit, and rebuilding the algorithm a checkpoint was
written by (what ``Algorithm.from_checkpoint``, ``shoal resume`` and ``shoal.load_policy`` use)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shoal import checkpoint as ckpt
from shoal.envs.normalize import RunningStats
from shoal.errors import CheckpointError

if TYPE_CHECKING:
    from shoal.config import AlgorithmConfig
    from shoal.framework.base import Algorithm


def saved_norm_stats(state: dict[str, Any]) -> RunningStats:
    """The normalization statistics a checkpoint's state holds, for a config with ``normalize`` on."""
    if "normalize" not in state:
        raise CheckpointError(
            "This checkpoint holds no normalization statistics, but the config sets "
            "normalize.obs or normalize.reward: it was written without them."
        )
    return RunningStats.from_state(state["normalize"])


def checkpoint_config_data(
    checkpoint: Path | ckpt.OpenedCheckpoint, given: dict[str, Any], trust: bool, destinations: bool = True
) -> tuple[type["AlgorithmConfig"], dict[str, Any], dict[str, Any], frozenset[str] | None]:
    """``(config class, meta, config data, approved import paths)`` to rebuild ``checkpoint`` (opened,
    or the directory of one) with the caller's ``given`` keys merged into its saved config; raises
    UntrustedCodeError when that config names code nobody vouched for, or, with ``destinations`` (the
    caller builds an algorithm, which may connect), a Ray cluster or tracker
    (:func:`shoal.trust.check_checkpoint_code`)."""
    from shoal.algorithms import get_config_class
    from shoal.config import deep_merge
    from shoal.trust import check_checkpoint_code

    opened = ckpt.open_checkpoint(checkpoint, resolve=False)
    meta = opened.meta
    config_cls = get_config_class(meta["algo"])
    # keys declared unused since the checkpoint was written never had an effect: drop them
    data = deep_merge(config_cls.without_unused(meta["config"]), given)
    approved = check_checkpoint_code(f"Checkpoint '{opened.path}'", meta, data, given, trust, destinations)
    return config_cls, meta, data, approved


def checkpoint_meta(algo: "Algorithm", **extra: Any) -> dict[str, Any]:
    """meta.json content: what rebuilds the algorithm (algo, config) plus readable facts, among
    them every figure a stop criterion reads, so ``shoal resume`` can tell a criterion already
    met without building the algorithm (or starting its actors)."""
    from shoal import __version__

    ret = algo.episodes.metrics()["episode_return_mean"]
    return {
        "algo": algo.config.algo,
        "shoal_version": __version__,
        "iteration": algo.iteration,
        "env_steps_sampled": int(algo.counters["env_steps_sampled"]),
        "time_total_s": float(algo.counters["time_total_s"]),
        "episode_return_mean": ret if math.isfinite(ret) else None,
        "config": algo.config.to_dict(redact=True),
        **extra,
    }


def restore_into(algo: "Algorithm", path: str | Path | ckpt.OpenedCheckpoint) -> None:
    """Load checkpoint ``path`` (opened, or a path: a run directory's latest) into ``algo``; a state
    that does not fit its run is a CheckpointError."""
    opened = ckpt.open_checkpoint(path, run=False)
    meta, path = opened.meta, opened.path
    if meta.get("algo") != algo.config.algo:
        raise CheckpointError(f"Checkpoint '{path}' is for algorithm '{meta.get('algo')}', not '{algo.config.algo}'.")
    try:
        algo.set_state(opened.state)
    except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as e:
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"Checkpoint '{path}' holds a state that does not fit the {algo.config.algo} run its meta.json "
            f"describes ({type(e).__name__}: {first}). Its state.pt was written by another algorithm or "
            "config, or replaced; use the checkpoint the run wrote."
        ) from None


def rebuild(checkpoint: ckpt.OpenedCheckpoint, given: dict[str, Any], trust: bool) -> tuple["Algorithm", str]:
    """The algorithm ``checkpoint`` was written by, built from its saved config with ``given`` merged
    in, and its algo name; its state not yet restored."""
    from shoal.trust import import_gate

    config_cls, meta, data, approved = checkpoint_config_data(checkpoint, given, trust)
    with import_gate(approved):
        return config_cls.from_dict(data).build(), meta["algo"]
