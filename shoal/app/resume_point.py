"""Where ``resume`` starts: the newest intact checkpoint and its progress, the stop criteria the
run goes on with, and the checks that refuse bad overrides before anything is touched."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from shoal import checkpoint as ckpt
from shoal.app.run_session import TrainSummary
from shoal.app.stop_criteria import Stop, _as_stop
from shoal.errors import CheckpointError, ConfigError

log = logging.getLogger("shoal.app.trainer")  # the run's logger, where these warnings have always gone


def _already_met(run_dir: Path, at: dict[str, Any], reason: str, start: Path, stop: Stop) -> TrainSummary:
    """The summary of a resume that has nothing to train: the checkpoint already meets ``stop``."""
    best = run_dir / "checkpoints" / "best"
    return TrainSummary(
        run_dir=run_dir,
        result=at,
        stop_reason=reason,
        solved=reason == "reward",
        best_return=math.nan,
        wall_s=0.0,
        last_checkpoint=start,
        best_checkpoint=best if best.is_dir() else None,
        stop_detail=stop.explain(at),
    )


def _resumed_stop(settings: dict[str, Any], stop: Stop | dict | None, given: Stop, no_stop_reward: bool) -> Stop:
    """The run's saved stop criteria with the ones given on top (and the reward one dropped if asked)."""
    saved_stop = _as_stop(settings.get("stop"))
    if stop is not None:
        merged = {**saved_stop.model_dump(), **{k: v for k, v in given.model_dump().items() if v is not None}}
        saved_stop = _as_stop(merged)
    if no_stop_reward:
        saved_stop = saved_stop.model_copy(update={"reward": None})
    return saved_stop


def _check_changes(path: Path, changes: dict[str, Any]) -> None:
    """A ConfigError now for a key of ``changes`` the run's algorithm cannot change mid-run."""
    from shoal.algorithms import get_config_class

    config_cls = get_config_class(ckpt.read_run_meta(path)["algo"])
    allowed = config_cls.mutable_keys
    bad = sorted(set(changes) - allowed)
    if bad:
        raise ConfigError(
            f"{config_cls.algo} cannot change {', '.join(map(repr, bad))} when a run resumes (it shapes buffers, "
            f"actors or the network); keys that can change: {', '.join(sorted(allowed)) or 'none'}. For the others, "
            f"start a new run: shoal train {config_cls.algo} -c CONFIG."
        )


def _check_overrides(path: Path, overrides: dict[str, Any], trust: bool) -> None:
    """A ConfigError now if ``overrides`` do not fit the checkpoint's config (e.g. a negative worker count)."""
    from shoal.framework.checkpointing import checkpoint_config_data
    from shoal.trust import import_gate

    config_cls, _, data, approved = checkpoint_config_data(path, overrides, trust)
    with import_gate(approved):
        config_cls.from_dict(data)


def newest_intact_checkpoint(ckpt_dir: Path, warn: bool = True) -> Path:
    """The newest numbered checkpoint that loads; each broken newer one is skipped, with a warning
    naming the checkpoint the run resumes from (``warn``). None loads: a CheckpointError listing
    what is wrong with each, and no word of an earlier checkpoint."""
    problems: list[tuple[Path, str]] = []
    for p in reversed(ckpt.list_checkpoints(ckpt_dir)):
        try:
            ckpt.verify_checkpoint(p)
        except CheckpointError as e:
            problems.append((p, e.problem if isinstance(e, ckpt.DamagedCheckpoint) else str(e)))
            continue
        for bad, problem in problems if warn else ():
            log.warning("%s is damaged, so the run resumes from %s: %s", bad.name, p.name, problem)
        return p
    detail = " ".join(m for _, m in problems)  # without the advice to use another checkpoint: there is none
    raise CheckpointError(
        f"No intact checkpoint in '{ckpt_dir}' to resume from: {detail} The run cannot go on; start a new "
        f"one from its config: shoal train -c {ckpt_dir.parent / 'config.yaml'}."
    )


def checkpoint_progress(path: Path) -> dict[str, Any]:
    """What stop criteria read (iteration, env steps, training time, mean return) at a checkpoint.

    From meta.json; a checkpoint written before meta.json held them all is read from state.pt.
    """
    from shoal.logging.metrics import EpisodeWindow

    meta = ckpt.read_run_meta(path)  # a missing or negative iteration is a CheckpointError, not a KeyError
    if "time_total_s" not in meta or "env_steps_sampled" not in meta:
        state, _ = ckpt.load_checkpoint(path)
        window = EpisodeWindow()
        window.set_state(state["episodes"])
        meta = {
            **meta,
            "env_steps_sampled": meta.get("env_steps_sampled", int(state["counters"]["env_steps_sampled"])),
            "time_total_s": meta.get("time_total_s", state["counters"]["time_total_s"]),
            "episode_return_mean": window.metrics()["episode_return_mean"],
        }
    ret = meta.get("episode_return_mean")
    return {
        "iteration": meta["iteration"],
        "env_steps_sampled": meta["env_steps_sampled"],
        "time_total_s": meta["time_total_s"],
        "episode_return_mean": math.nan if ret is None else ret,
    }
