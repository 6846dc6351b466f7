"""The training loop the CLI runs: run directory, writers, checkpoints, progress, stop criteria.

It is the body of ``shoal.train()`` (the public API entry), kept out of ``shoal/__init__.py``
so that importing shoal stays cheap. Its parts live beside it: the stop criteria
(stop_criteria.py), a session's bookkeeping and summary (run_session.py), a run directory's
files (run_files.py) and where a resumed run starts (resume_point.py).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from pathlib import Path
from typing import Any, Callable

from shoal import checkpoint as ckpt
from shoal.app.resume_point import (
    _already_met,
    _check_changes,
    _check_overrides,
    _resumed_stop,
    checkpoint_progress,
    newest_intact_checkpoint,
)
from shoal.app.run_files import _run_settings, _write_config, _write_run_settings, check_out_dir, new_run_dir
from shoal.app.run_lock import run_lock
from shoal.app.run_session import STORAGE_ERRNOS, TrainSummary, _Session, storage_error
from shoal.app.stop_criteria import Stop, _as_stop
from shoal.config import AlgorithmConfig, deep_merge
from shoal.errors import (
    CheckpointError,
    ConfigError,
    DivergenceError,
    EnvFailureError,
    NonFiniteEnvError,
    RayLostError,
    WorkerError,
)
from shoal.gym_ids import is_ale_id
from shoal.logging.progress import ProgressDisplay
from shoal.logging.results import read_results
from shoal.logging.writers import truncate_results
from shoal.runtime import deadline, signals
from shoal.runtime.signals import raylet_lost

__all__ = ["Stop", "TrainSummary", "load", "resume", "train"]  # the public API (docs/api/trainer.md)

log = logging.getLogger("shoal.app.trainer")


def _start_actors(algo, owned: bool) -> None:
    """Start the rollout actors; a failure (e.g. a cluster too small) stops an algorithm train() built."""
    try:
        algo.start_actors()
    except BaseException:
        if owned:
            algo.stop()
        raise


def _ray_lost(session: "_Session", run_dir: Path | None) -> RayLostError:
    """The run's local Ray died under it: save what the driver holds, and say so in one paragraph."""
    note = ""
    try:
        with signals.saving():
            session.save_interrupted()
    except Exception as err:  # noqa: BLE001 - state held by actors of the dead Ray cannot be read
        note = f" Saving a last checkpoint failed ({type(err).__name__})."
    last = ckpt.list_checkpoints(session.ckpt_dir) if session.ckpt_dir is not None else []
    where = f" The newest checkpoint is {last[-1]}; continue with `shoal resume {run_dir}`." if last else ""
    return RayLostError(
        "The local Ray instance stopped under the run: its raylet process died (killed, or ended by "
        f"the out-of-memory killer: see `dmesg`), so no actor can be reached.{note}{where}"
    )


def train(
    config: AlgorithmConfig,
    stop: Stop | dict | None = None,
    *,
    out: str | Path | None = "runs",
    checkpoint_every: int = 10,
    keep_checkpoints: int = 3,
    progress: bool = True,
    config_note: str | None = None,
    on_start: Callable[[], None] | None = None,
    _algo=None,
    _run_dir: Path | None = None,
) -> TrainSummary:
    """Train until a stop criterion is met; returns a ``TrainSummary``.

    With ``out`` set, a run directory ``<out>/<algo>_<env>_<timestamp>/`` gets config.yaml,
    results.jsonl, progress.csv, TensorBoard events and ``checkpoints/`` (every
    ``checkpoint_every`` iterations, the last ``keep_checkpoints`` kept, plus ``best``).
    ``out=None`` trains without writing anything. Ctrl-C stops cleanly after saving.
    ``config_note`` leads config.yaml as a YAML comment (e.g. the CLI's word that a preset set
    some keys), so the file tells where its values came from and still loads as it is.
    ``on_start`` is called once the algorithm is built and its actors started, before the run
    directory is written (the CLI prints its notes there: a config that fails shows only the error).
    """
    stop = _as_stop(stop)
    if checkpoint_every < 1 or keep_checkpoints < 1:
        raise ConfigError("checkpoint_every and keep_checkpoints must be at least 1.")
    if out is not None and _run_dir is None:
        check_out_dir(out)
    config.logging.check_installed()  # a missing wandb/mlflow package is a config error, before anything starts
    t_start = time.perf_counter()
    with _starting():  # Ctrl-C while Ray and the actors start: nothing trained, nothing written
        algo = _algo or config.build()
        _start_actors(
            algo, owned=_algo is None
        )  # a cluster too small for the run fails before the run directory is written
    if on_start is not None:
        on_start()
    run_dir, lock, session = _open_run(
        algo, out, _run_dir, stop, checkpoint_every, keep_checkpoints, config_note, owned=_algo is None
    )
    try:
        reason, result = _iterate(algo, session, run_dir, stop, checkpoint_every, t_start, progress)
    finally:
        session.close()
        if run_dir is not None:
            _draw_curves(run_dir, algo.best_metric)
        lock.close()
        if _algo is None:
            algo.stop()
    return session.summary(stop, result, reason, wall_s=time.perf_counter() - t_start)


def _draw_curves(run_dir: Path, best_metric: str) -> None:
    """``curves.png``: the run's mean return (or its ``best_metric``, a league's) against env steps.
    A picture is never worth a failed run: any error is logged and the run goes on as it was."""
    from shoal.app.plotting import plot_runs

    try:
        plot_runs([run_dir], run_dir / "curves.png", key=best_metric, title=run_dir.name)
    except ConfigError:
        log.debug("no curves.png for %s: no finite %s yet", run_dir, best_metric)
    except Exception as e:  # noqa: BLE001 - matplotlib, a full disk: the run's own files matter, not this
        log.warning("could not draw %s: %s", run_dir / "curves.png", e)


def _open_run(
    algo,
    out: str | Path | None,
    run_dir: Path | None,
    stop: Stop,
    checkpoint_every: int,
    keep_checkpoints: int,
    config_note: str | None,
    owned: bool,
):
    """``(run_dir, lock, session)``: the run directory (a new one, unless ``run_dir`` resumes one;
    None without ``out``), the lock that makes this process its one writer, and the session that
    writes into it. On a failure here the lock is released and an ``owned`` algorithm stopped."""
    resuming = run_dir is not None
    if run_dir is None and out is not None:
        run_dir = new_run_dir(out, algo.config)
        _write_config(run_dir, algo.config, config_note)
    lock = contextlib.ExitStack()  # one process writes a run directory at a time (resume holds it already)
    try:
        if run_dir is not None:
            lock.enter_context(run_lock(run_dir))
            _write_run_settings(run_dir, stop, checkpoint_every, keep_checkpoints)
        session = _Session(algo, run_dir, keep_checkpoints)  # opens the loggers: W&B or MLflow may refuse
    except BaseException:
        lock.close()
        if owned:
            algo.stop()
        raise
    if resuming and session.ckpt_dir is not None:  # the run's best so far still counts
        session.best.remember(session.ckpt_dir / "best")
    return run_dir, lock, session


def _iterate(
    algo, session: "_Session", run_dir: Path | None, stop: Stop, checkpoint_every: int, t_start: float, progress: bool
) -> tuple[str | None, dict[str, Any]]:
    """Iterations until a stop criterion, a signal or a fatal error: ``(reason, last result)``.
    Every way out saves what it can (a checkpoint, or the state at the interruption)."""
    reason, result = None, {}
    config = algo.config
    title = f"{config.algo} on {config.env_name()}" + (f"  ->  {run_dir}" if run_dir else "")
    try:
        with (
            ProgressDisplay(
                title,
                stop,
                enabled=progress,
                best_metric=session.best.metric,
                metrics=algo.display_metrics(),
                headline_every=_evaluated_every(config, session.best.metric),
                steps_label="agent steps" if is_ale_id(config.env) else "env steps",  # Atari: frame_skip frames each
                resumed_from=_resumed_from(algo, run_dir, session.best.value),
            ) as display,
            signals.stop_on_signals(),
        ):
            while not reason:
                with deadline.limit(None if stop.time_s is None else stop.time_s - algo.counters["time_total_s"]):
                    result = algo.train()
                with signals.deferred():  # the row and the counters a stop checkpoint keeps go together
                    session.record(result)
                    session.iteration_done()
                display.update(result, time.perf_counter() - t_start, best=session.best.value)
                reason = stop.reached(result)
                if session.ckpt_dir is not None and (algo.iteration % checkpoint_every == 0 or reason):
                    session.checkpoint(result, final=bool(reason))
    except signals.SaveAborted:
        raise
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (signals.Terminated): abandon the iteration, save the last
        if raylet_lost():  # the interrupt came from the raylet watch: Ray is gone
            raise _ray_lost(session, run_dir) from None
        reason = "terminated" if isinstance(e, signals.Terminated) else "interrupted"
        with signals.saving():
            session.save_interrupted()
    except deadline.DeadlineReached:  # --stop-time passed while waiting on an actor that does not answer
        log.warning("the training time (stop time_s=%g) ran out while waiting on actors; stopping", stop.time_s)
        reason, result = "time", {**result, "time_total_s": algo.counters["time_total_s"]}
        with signals.saving():
            session.save_interrupted()
    except (EnvFailureError, NonFiniteEnvError, DivergenceError, WorkerError) as e:
        with signals.saving():
            raise session.fatal(e) from None
    except OSError as e:
        if e.errno not in STORAGE_ERRNOS:
            raise
        with signals.saving():
            raise session.fatal(storage_error(e, run_dir)) from None
    return reason, result


def _resumed_from(algo, run_dir: Path | None, best: float) -> dict[str, Any] | None:
    """A resumed run's figures where it resumes, for the progress display to count from the run's
    start (its earlier env steps, time and iterations, its best so far) until the first result;
    None for a new run."""
    if algo.iteration == 0:
        return None
    first = None
    if run_dir is not None and (run_dir / "results.jsonl").is_file():
        rows, _ = read_results(run_dir / "results.jsonl")
        returns = (r.get("episode_return_mean") for r in rows)
        first = next((v for v in returns if isinstance(v, (int, float)) and math.isfinite(v)), None)
    return {
        "iteration": algo.iteration,
        "env_steps_sampled": int(algo.counters["env_steps_sampled"]),
        "time_total_s": float(algo.counters["time_total_s"]),
        **algo.episodes.metrics(),
        "first_return": first,
        "best": best,
    }


def _evaluated_every(config: AlgorithmConfig, metric: str) -> int | None:
    """The iterations between two values of ``metric`` when an evaluation reports it, else None."""
    evaluation = getattr(config, "evaluation", None)
    return evaluation.evaluation_interval if evaluation is not None and metric.startswith("evaluation/") else None


def resume(
    run_dir: str | Path,
    stop: Stop | dict | None = None,
    overrides: dict[str, Any] | None = None,
    progress: bool = True,
    trust: bool = False,
    changes: dict[str, Any] | None = None,
    no_stop_reward: bool = False,
) -> TrainSummary:
    """Continue a run from its latest intact checkpoint, with its counters, appending to its files.

    ``overrides`` rebuild the run with other settings (e.g. ``{"resources": {"num_workers": 4}}``);
    ``changes`` are keys that may change mid-run (the algorithm's ``mutable_keys``, what Tune's
    PBT perturbs: ``lr``, ``entropy_coeff``...), applied after the restore as ``update_config``
    applies them, so the optimizer takes the new ``lr``. Any other key is refused before anything
    is read further. ``trust``: import the code the run's config names (its env factory, model,
    callbacks) even though its checkpoint is not signed with your key (see :mod:`shoal.trust`).
    ``no_stop_reward``: drop the run's reward criterion (``stop`` may not give one then)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"Run directory '{run_dir}' does not exist.")
    if not (run_dir / "checkpoints").is_dir():
        raise CheckpointError(f"'{run_dir}' has no checkpoints/ to resume from; is it a shoal run directory?")
    with run_lock(run_dir):  # before anything is read or repaired: another process may be writing it
        return _resume_locked(run_dir, stop, overrides, progress, trust, changes or {}, no_stop_reward)


@contextlib.contextmanager
def _starting():
    """A Ctrl-C inside is :class:`~shoal.runtime.signals.StartInterrupted` (nothing trained yet),
    unless the raylet watch sent it: Ray is gone, and that interrupt goes on as it is."""
    try:
        yield
    except KeyboardInterrupt:
        if raylet_lost():
            raise
        raise signals.StartInterrupted() from None


def _resume_locked(
    run_dir: Path,
    stop: Stop | dict | None,
    overrides: dict[str, Any] | None,
    progress: bool,
    trust: bool,
    changes: dict[str, Any],
    no_stop_reward: bool = False,
) -> TrainSummary:
    from shoal.framework.base import Algorithm

    settings = _run_settings(run_dir)
    given = _as_stop(stop)  # a bad value is an error before anything is read further or changed
    if no_stop_reward and given.reward is not None:
        raise ConfigError(
            f"--stop-reward {given.reward:g} and --no-stop-reward contradict each other; give one of them."
        )
    checkpoints = run_dir / "checkpoints"
    if (overrides or changes) and ckpt.list_checkpoints(checkpoints):  # refused before anything is touched
        newest = newest_intact_checkpoint(checkpoints, warn=False)  # the start's choice below warns
        _check_changes(newest, changes)
        _check_overrides(newest, deep_merge(overrides or {}, changes), trust)
    for note in ckpt.remove_leftovers(checkpoints):  # puts back a checkpoint a killed save had moved aside
        log.warning("%s: %s (left by a save that was killed)", checkpoints, note)
    if not ckpt.list_checkpoints(checkpoints):
        raise CheckpointError(
            f"'{run_dir}' has no checkpoints/checkpoint_* to resume from; is it a shoal run directory?"
        )
    start = newest_intact_checkpoint(checkpoints)
    saved_stop = _resumed_stop(settings, stop, given, no_stop_reward)
    at = checkpoint_progress(start)
    reason = saved_stop.reached(at)
    if reason:  # nothing to do: say so, without building the algorithm or starting actors
        return _already_met(run_dir, at, reason, start, saved_stop)
    with _starting():  # Ctrl-C while Ray and the actors start: nothing trained, the run as its checkpoint left it
        algo = Algorithm.from_checkpoint(start, overrides=overrides, trust=trust)
    try:
        with _starting():
            if changes:  # after the restore, which put back the optimizer's saved lr
                algo.update_config(changes)
            truncate_results(run_dir, algo.iteration)  # drops only rows past the checkpoint
        return train(
            algo.config,
            saved_stop,
            out=None,
            checkpoint_every=settings.get("checkpoint_every", 10),
            keep_checkpoints=settings.get("keep_checkpoints", 3),
            progress=progress,
            _algo=algo,
            _run_dir=run_dir,
        )
    finally:
        algo.stop()


def load(path: str | Path | ckpt.OpenedCheckpoint, **kwargs: Any):
    """An algorithm restored from a checkpoint (or a run directory's best checkpoint, or a checkpoint
    opened by :func:`shoal.checkpoint.open_checkpoint`).

    Keyword arguments go to ``Algorithm.from_checkpoint``: ``overrides`` (a nested dict
    merged into the saved config) and top-level config keys such as ``env=my_callable``.
    """
    from shoal.framework.base import Algorithm

    return Algorithm.from_checkpoint(ckpt.open_checkpoint(path, prefer="best"), **kwargs)
