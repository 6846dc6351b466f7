"""One ``train()`` call's bookkeeping: result files, best figures, checkpoints, and what it returns
(:class:`TrainSummary`); the run directory's storage errors told as such."""

from __future__ import annotations

import copy
import errno
import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal import checkpoint as ckpt
from shoal.app.stop_criteria import Stop
from shoal.errors import CheckpointError, ConfigError, DivergenceError, RunDirectoryError, ShoalError
from shoal.logging.writers import TensorBoardWriter, build_writers


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
