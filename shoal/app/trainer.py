"""The training loop the CLI runs: run directory, writers, checkpoints, progress, stop criteria.

It is the body of ``shoal.train()`` (the public API entry), kept out of ``shoal/__init__.py``
so that importing shoal stays cheap.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import logging
import math
import numbers
import textwrap
import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field

from shoal import checkpoint as ckpt
from shoal.app.run_lock import run_lock
from shoal.config import AlgorithmConfig, deep_merge
from shoal.errors import (
    CheckpointError,
    ConfigError,
    DivergenceError,
    EnvFailureError,
    NonFiniteEnvError,
    RayLostError,
    RunDirectoryError,
    ShoalError,
    WorkerError,
)
from shoal.files import safe_yaml, unwritable_ancestor
from shoal.gym_ids import is_ale_id
from shoal.logging.progress import ProgressDisplay
from shoal.logging.results import read_results
from shoal.logging.writers import TensorBoardWriter, build_writers, truncate_results
from shoal.runtime import deadline, signals
from shoal.runtime.signals import raylet_lost

log = logging.getLogger("shoal.app.trainer")


class Stop(BaseModel):
    """Stop when any criterion is met. Steps, time and iterations count over a resumed run too."""

    model_config = ConfigDict(extra="forbid")
    reward: Optional[float] = Field(
        None,
        allow_inf_nan=False,
        description="episode_return_mean (over the last episode_window episodes, 100 by default) reaches this "
        "(a finite number).",
    )
    env_steps: Optional[int] = Field(None, ge=1, description="env_steps_sampled reaches this.")
    time_s: Optional[float] = Field(None, gt=0, description="time_total_s (training time) reaches this.")
    iterations: Optional[int] = Field(None, ge=1)

    def reached(self, r: dict[str, Any]) -> str | None:
        """The first criterion result ``r`` meets (reward, env_steps, time, iterations), or None."""
        met = self._first_met(r)
        return met[0] if met else None

    def explain(self, r: dict[str, Any]) -> str | None:
        """The first criterion ``r`` meets, with its figures, e.g. ``"iterations 4 >= 4"``; or None."""
        met = self._first_met(r)
        return met[1] if met else None

    def _first_met(self, r: dict[str, Any]) -> tuple[str, str] | None:
        checks = (  # reason, words, result value, target, format of the value
            ("reward", "mean return", r.get("episode_return_mean"), self.reward, ".1f"),
            ("env_steps", "env steps", r.get("env_steps_sampled"), self.env_steps, ","),
            ("time", "training time", r.get("time_total_s"), self.time_s, ".1f"),
            ("iterations", "iterations", r.get("iteration"), self.iterations, ""),
        )
        for reason, words, value, target, spec in checks:
            if target is not None and value is not None and math.isfinite(value) and value >= target:
                unit = " s" if reason == "time" else ""
                return reason, f"{words} {value:{spec}}{unit} >= {_number(target)}{unit}"
        return None

    def is_empty(self) -> bool:
        return all(v is None for v in self.model_dump().values())


def _number(x: float) -> str:
    """475.0 -> '475', 1000000 -> '1,000,000', 0.5 -> '0.5'."""
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


@dataclass
class TrainSummary:
    """What ``train`` and ``resume`` return: the run directory, the last result, why
    training stopped (``stop_reason``, ``stop_detail``), whether a reward criterion was met
    (``solved``), the best value of the algorithm's ``best_metric`` and the checkpoints written."""

    run_dir: Path | None
    result: dict[str, Any]
    stop_reason: str | None  # reward / env_steps / time / iterations / interrupted (Ctrl-C) / terminated (SIGTERM)
    solved: bool
    best_return: float  # the highest episode_return_mean of this session
    wall_s: float
    last_checkpoint: Path | None = None
    best_checkpoint: Path | None = None
    results: list[dict[str, Any]] = field(default_factory=list, repr=False)  # this session's iterations
    stop_detail: str | None = None  # the criterion met, with its figures: "iterations 4 >= 4"
    best_metric: str = "episode_return_mean"  # the algorithm's Algorithm.best_metric: what picked best_checkpoint
    best_value: float = math.nan  # its best value this session (NaN: never reported)
    # Algorithm.summary_lines: a league's figures in place of its mean return (empty: the mean return)
    summary_lines: list[str] = field(default_factory=list)

    @property
    def already_met(self) -> bool:
        """``resume`` found a stop criterion met at the checkpoint and trained nothing."""
        return not self.results and self.stop_reason not in (None, "interrupted", "terminated")


class BestMetric:
    """The best value of an algorithm's ``best_metric`` so far; ``offer`` says when a result beats it."""

    def __init__(self, algo) -> None:
        self.metric, self.mode = algo.best_metric, algo.best_metric_mode
        if self.mode not in ("max", "min"):
            raise ConfigError(f"{type(algo).__name__}.best_metric_mode is {self.mode!r}; it must be 'max' or 'min'.")
        self.value = math.nan

    def remember(self, best_dir: Path) -> None:
        """Take the value a run's ``checkpoints/best`` was saved with, so a resumed run only replaces it when better."""
        try:
            meta = ckpt.read_meta(best_dir)
        except CheckpointError:
            return  # no best yet, or a damaged one: the first result of this session becomes it
        v = meta.get("best_value")
        if meta.get("best_metric") == self.metric and isinstance(v, (int, float)) and math.isfinite(v):
            self.value = float(v)

    def offer(self, result: dict[str, Any]) -> bool:
        """Take ``result``'s value if it is better; a missing, non-numeric or NaN value never is."""
        v = result.get(self.metric)
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
            return False
        value = float(v)
        if math.isnan(self.value) or (value > self.value if self.mode == "max" else value < self.value):
            self.value = value
            return True
        return False


def _as_stop(stop: Stop | dict | None) -> Stop:
    if stop is None:
        return Stop()
    if isinstance(stop, Stop):
        return stop
    try:
        return Stop(**stop)
    except Exception as e:  # noqa: BLE001 - pydantic error -> one paragraph
        from pydantic import ValidationError

        from shoal.config import format_validation_error

        detail = format_validation_error(Stop, e) if isinstance(e, ValidationError) else f"{e}."
        raise ConfigError(
            f"Invalid stop criteria {stop!r}: {detail} Allowed keys: reward, env_steps, time_s, iterations."
        ) from None


def check_out_dir(out: str | Path) -> None:
    """A ConfigError unless run directories can be made under ``out``: an existing directory, or a
    path whose nearest existing ancestor is a writable directory."""
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise ConfigError(
            f"--out '{out}' is not a directory (run directories are made inside it); give a directory such as runs/."
        )
    ancestor = unwritable_ancestor(p)
    if ancestor is not None:
        raise ConfigError(
            f"--out '{out}': '{ancestor}' is not a writable directory, so no run directory can be made "
            "there; give a directory you can write."
        )


def new_run_dir(out: str | Path, config: AlgorithmConfig) -> Path:
    """A new run directory ``<algo>_<env>_<timestamp>`` under ``out``, or ``..._<timestamp>-1``,
    ``-2``, ... when that name is taken. Each name is claimed by its mkdir (which fails on an
    existing directory), not by a look first: two runs started in the same second, in separate
    processes, never get the same directory."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(out) / f"{config.algo}_{config.env_name()}_{stamp}"
    base.parent.mkdir(parents=True, exist_ok=True)
    d, i = base, 1
    while True:
        try:
            d.mkdir()
            return d
        except FileExistsError:
            d, i = base.with_name(f"{base.name}-{i}"), i + 1


def _write_config(run_dir: Path, config: AlgorithmConfig, config_note: str | None) -> None:
    """config.yaml, led by ``config_note`` as YAML comment lines."""
    if isinstance(config.callbacks, type) and config.to_dict()["callbacks"] is None:
        warnings.warn(
            f"callbacks class {config.callbacks.__qualname__} is defined in __main__ or inside a function, "
            "so config.yaml and checkpoints record no callbacks (resume and evaluate run without them); "
            "define it in a module to keep it.",
            stacklevel=3,
        )
    comment = "".join(f"# {line}\n" for line in textwrap.wrap(config_note or "", 100, break_on_hyphens=False))
    (run_dir / "config.yaml").write_text(comment + config.to_yaml())


def _write_run_settings(run_dir: Path, stop: Stop, checkpoint_every: int, keep_checkpoints: int) -> None:
    """run.yaml: what ``resume`` needs besides the checkpoint (stop criteria, checkpoint cadence)."""
    ckpt.write_text_atomic(
        run_dir / "run.yaml",
        yaml.safe_dump(
            {  # resume rewrites it: never leave it torn
                "stop": stop.model_dump(),
                "checkpoint_every": checkpoint_every,
                "keep_checkpoints": keep_checkpoints,
            }
        ),
    )


def _start_actors(algo, owned: bool) -> None:
    """Start the rollout actors; a failure (e.g. a cluster too small) stops an algorithm train() built."""
    try:
        algo.start_actors()
    except BaseException:
        if owned:
            algo.stop()
        raise


class _Session:
    """One ``train()`` call's bookkeeping: result files, this session's results and best figures,
    and the checkpoints (numbered ones, of which the last ``keep_checkpoints`` stay, and ``best``).

    Without a run directory it writes nothing and only tracks the results and best figures.
    """

    def __init__(self, algo, run_dir: Path | None, keep_checkpoints: int) -> None:
        self.algo, self.run_dir, self.keep_checkpoints = algo, run_dir, keep_checkpoints
        self.writers = build_writers(run_dir, algo.config, algo.best_metric) if run_dir else []
        self.ckpt_dir = run_dir / "checkpoints" if run_dir else None
        self.best = BestMetric(algo)
        self.best_return = -math.inf  # the highest episode_return_mean, whatever best_metric is
        self.results: list[dict[str, Any]] = []
        self.last_ckpt: Path | None = None
        # best_metric's best iteration: its state, kept in memory until the next numbered checkpoint
        self._best_state = self._best_meta = self._best_iter = self._saved_best_iter = None
        self._finished_counters: dict[str, Any] | None = None
        self._finished_iteration = 0
        self.iteration_done()

    def record(self, result: dict[str, Any]) -> None:
        """Write one iteration's result and take note of a new best."""
        algo = self.algo
        self.results.append(result)
        for w in self.writers:
            w.write(result)
        ret = result.get("episode_return_mean", math.nan)
        if math.isfinite(ret) and ret > self.best_return:
            self.best_return = ret
        if self.best.offer(result):
            self._best_iter = algo.iteration
            if self.ckpt_dir is not None:
                self._best_state = copy.deepcopy(algo.get_state())
                self._best_meta = algo.checkpoint_meta(best_metric=self.best.metric, best_value=self.best.value)

    def checkpoint(self, result: dict[str, Any], final: bool = False) -> None:
        """A numbered checkpoint (and ``best``, when it changed), then the algorithm's TensorBoard extras."""
        self.last_ckpt = self._save_numbered(final)
        tb = next((w.w for w in self.writers if isinstance(w, TensorBoardWriter) and w.w is not None), None)
        if tb is not None:  # e.g. the league's tables and heatmap
            self.algo.log_tensorboard_extras(tb, int(result.get("env_steps_sampled", self.algo.iteration)))

    def iteration_done(self) -> None:
        """The counters and number of the last finished iteration: those its results row shows."""
        self._finished_counters = dict(self.algo.counters)
        self._finished_iteration = self.algo.iteration

    def save_interrupted(self) -> None:
        """On Ctrl-C, SIGTERM or the stop time: a numbered checkpoint of the last finished iteration,
        unless it has one already. An iteration cut short has sampled (and maybe learned) some
        more; the checkpoint keeps the counters and number of the finished one, so they agree with
        results.jsonl (a signal may land after ``train()`` counted the iteration, before its row is written)."""
        if self._finished_counters is not None:
            self.algo.counters.update(self._finished_counters)
        self.algo.iteration = self._finished_iteration
        it = self.algo.iteration
        if (
            self.ckpt_dir is not None
            and it
            and (self.last_ckpt is None or not self.last_ckpt.name.endswith(f"{it:06d}"))
        ):
            self.last_ckpt = self._save_numbered(final=True)

    def fatal(self, e: ShoalError) -> ShoalError:
        """``e``, which stops the run, told where the last good checkpoint is. An env that kept failing
        (or sent NaN) leaves the learner's state good, so that state is saved first; a divergence saves nothing."""
        if self.ckpt_dir is None:
            return e
        if not isinstance(e, DivergenceError):
            try:
                self.save_interrupted()
            except DivergenceError:
                pass
            except OSError as err:  # the disk that failed the run fails the save too: say so, keep the first error
                if err.errno not in STORAGE_ERRNOS:
                    raise
                e.args = (f"{e} Saving a checkpoint failed too ({err.strerror}).",)
        last = ckpt.list_checkpoints(self.ckpt_dir)
        note = (
            f"The newest checkpoint (finite weights) is {last[-1]}." if last else "No checkpoint had been written yet."
        )
        e.args = (f"{e} {note}",)
        return e

    def _save_numbered(self, final: bool = False) -> Path:
        ckpt_dir = self.ckpt_dir
        if ckpt_dir is None:
            raise RuntimeError("A run without a run directory writes no checkpoint.")
        p = self.algo.save(ckpt_dir / f"checkpoint_{self.algo.iteration:06d}")
        for old in ckpt.list_checkpoints(ckpt_dir)[: -self.keep_checkpoints]:
            ckpt.delete_checkpoint(old)
        self._saved(p, "final" if final else "numbered")
        if self._best_state is not None and self._saved_best_iter != self._best_iter:
            self._saved(ckpt.save_checkpoint(ckpt_dir / "best", self._best_state, self._best_meta), "best")
            self._saved_best_iter = self._best_iter
        return p

    def _saved(self, path: Path, kind: str) -> None:
        """A checkpoint is on disk: tell the writers that track them, then the user's callbacks."""
        for w in self.writers:
            if hasattr(w, "checkpoint"):
                w.checkpoint(path, kind)
        self.algo.callbacks.on_checkpoint(self.algo, path, kind)

    def close(self) -> None:
        for w in self.writers:
            w.close()

    def summary(self, stop: Stop, result: dict[str, Any], reason: str | None, wall_s: float) -> TrainSummary:
        best = self.ckpt_dir / "best" if self.ckpt_dir is not None else None
        return TrainSummary(
            run_dir=self.run_dir,
            result=result,
            stop_reason=reason,
            stop_detail=stop.explain(result) if reason not in (None, "interrupted", "terminated") else None,
            solved=stop.reward is not None and reason == "reward",
            best_return=self.best_return,
            wall_s=wall_s,
            last_checkpoint=self.last_ckpt,
            best_checkpoint=best if best is not None and best.exists() else None,
            results=self.results,
            best_metric=self.best.metric,
            best_value=self.best.value,
            summary_lines=self.algo.summary_lines(self.results),
        )


STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}
"""Write errors that are the run directory's storage (full, read-only, not ours), not a bug."""


def storage_error(e: OSError, run_dir: Path | None) -> RunDirectoryError:
    where = f"'{e.filename}'" if e.filename else (f"the run directory '{run_dir}'" if run_dir else "a file")
    advices: dict[int | None, str] = {
        errno.ENOSPC: "The disk is full: free space on it",
        errno.EDQUOT: "The disk quota is used up: free some",
        errno.EROFS: "The file system is read-only: make it writable",
    }
    advice = advices.get(e.errno, "shoal may not write there: fix the permissions (or the owner) of the run directory")
    return RunDirectoryError(
        f"Writing {where} failed: {e.strerror}. {advice}, then continue with `shoal resume {run_dir}`."
        if run_dir
        else f"Writing {where} failed: {e.strerror}."
    )


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


def _resume_locked(
    run_dir: Path,
    stop: Stop | dict | None,
    overrides: dict[str, Any] | None,
    progress: bool,
    trust: bool,
    changes: dict[str, Any],
    no_stop_reward: bool = False,
) -> TrainSummary:
    from shoal.algorithms.base import Algorithm

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


def _run_settings(run_dir: Path) -> dict[str, Any]:
    """A run directory's run.yaml (stop criteria, checkpoint settings); {} when it has none."""
    run_file = run_dir / "run.yaml"
    if not run_file.is_file():
        return {}
    try:
        settings = safe_yaml(run_file.read_text(encoding="utf-8")) or {}
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        detail = "it is not UTF-8 text" if isinstance(e, UnicodeDecodeError) else " ".join(str(e).split())
        raise CheckpointError(
            f"'{run_file}' cannot be read ({detail}); it holds the run's stop criteria and "
            "checkpoint settings as `shoal train` wrote them. Restore it, or delete it to resume "
            "with no stop criterion but the ones you give."
        ) from None
    if not isinstance(settings, dict):
        raise CheckpointError(
            f"'{run_file}' holds {type(settings).__name__}, not the mapping `shoal train` writes; "
            "restore it, or delete it to resume with the stop criteria you give."
        )
    for key in ("checkpoint_every", "keep_checkpoints"):
        value = settings.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise CheckpointError(
                f"'{run_file}': {key} is {value!r}, but it must be a whole number of at least 1 "
                f"(`shoal train` wrote one). Fix that line, or delete run.yaml to resume with the "
                "defaults and the stop criteria you give."
            )
    return settings


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
    from shoal.algorithms.checkpointing import checkpoint_config_data
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


def load(path: str | Path | ckpt.OpenedCheckpoint, **kwargs: Any):
    """An algorithm restored from a checkpoint (or a run directory's best checkpoint, or a checkpoint
    opened by :func:`shoal.checkpoint.open_checkpoint`).

    Keyword arguments go to ``Algorithm.from_checkpoint``: ``overrides`` (a nested dict
    merged into the saved config) and top-level config keys such as ``env=my_callable``.
    """
    from shoal.algorithms.base import Algorithm

    return Algorithm.from_checkpoint(ckpt.open_checkpoint(path, prefer="best"), **kwargs)
