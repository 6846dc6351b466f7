"""Per-iteration result writers: results.jsonl, progress.csv and TensorBoard events.

A writer has ``write(result)`` and ``close()``; one may also have ``checkpoint(path, kind)``,
which the trainer calls once a checkpoint is on disk. Weights & Biases and MLflow writers live
in :mod:`shoal.logging.trackers`; :func:`build_writers` makes the ones a config chooses.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import warnings
from pathlib import Path
from typing import Any

from shoal.checkpoint import write_text_atomic
from shoal.logging.results import parse_row
from shoal.logging.values import flatten_config, scalar_items  # noqa: F401  (re-exported)

log = logging.getLogger("shoal.writers")


def _same_file(f, path: Path) -> bool:
    """Whether the open file ``f`` is still the file at ``path``."""
    try:
        a, b = os.fstat(f.fileno()), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class JsonlWriter:
    """results.jsonl, one JSON row per iteration. A file deleted (or moved) during the run is
    started anew at the next row, with a warning: the rows after it are not lost."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.f = open(path, "a", buffering=1)

    def write(self, result: dict[str, Any]) -> None:
        if not _same_file(self.f, self.path):
            log.warning(
                "%s was deleted or replaced during the run; writing a new one from iteration %s on",
                self.path,
                result.get("iteration", "?"),
            )
            self.f.close()
            self.f = open(self.path, "a", buffering=1)
        self.f.write(json.dumps({k: _clean(v) for k, v in result.items()}, default=str) + "\n")

    def close(self) -> None:
        self.f.close()


class CsvWriter:
    """One column per scalar metric seen so far (the existing header when resuming).

    A row that brings new metrics (evaluation results, a league's new players) extends the
    header: the file is rewritten once with the wider header, earlier rows getting empty
    cells, so no metric is ever dropped and every row has as many cells as the header.
    A file deleted (or moved) during the run is started anew at the next row, with its
    header and a warning, as :class:`JsonlWriter` does.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.columns: list[str] = []
        if path.exists() and path.stat().st_size:
            with open(path, newline="") as f:
                self.columns = next(csv.reader(f), None) or []
        self.f = open(path, "a", newline="", buffering=1)
        self.w = csv.writer(self.f)

    def write(self, result: dict[str, Any]) -> None:
        if not _same_file(self.f, self.path):
            self._start_anew(result.get("iteration", "?"))
        new = [
            k
            for k, v in result.items()
            if k not in self.columns and (isinstance(v, (int, float, str, bool)) or v is None)
        ]
        if new:
            self._extend(new)
        self.w.writerow(["" if _clean(result.get(c)) is None else result.get(c) for c in self.columns])

    def _start_anew(self, iteration: Any) -> None:
        """A new file in place of one deleted or replaced: the header so far (or the one a file
        put there has), then this row on."""
        log.warning(
            "%s was deleted or replaced during the run; writing a new one (with its header) from iteration %s on",
            self.path,
            iteration,
        )
        self.f.close()
        empty = not (self.path.exists() and self.path.stat().st_size)
        if not empty:
            with open(self.path, newline="") as f:
                self.columns = next(csv.reader(f), None) or []
        self.f = open(self.path, "a", newline="", buffering=1)
        self.w = csv.writer(self.f)
        if empty and self.columns:
            self.w.writerow(self.columns)

    def _extend(self, new: list[str]) -> None:
        """Rewrite the file with ``new`` columns appended to the header (rare: once per new metric set)."""
        self.f.close()
        rows = []
        if self.path.exists() and self.path.stat().st_size:
            with open(self.path, newline="") as f:
                rows = list(csv.reader(f))[1:]
        self.columns = self.columns + new
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(self.columns)
            w.writerows(r + [""] * (len(self.columns) - len(r)) for r in rows)
        os.replace(tmp, self.path)
        self.f = open(self.path, "a", newline="", buffering=1)
        self.w = csv.writer(self.f)

    def close(self) -> None:
        self.f.close()


class TensorBoardWriter:
    """Scalars against env_steps_sampled; with ``config``, the resolved config as YAML text and as
    hparams (flattened keys) under the ``headline`` metric. Missing tensorboard only warns."""

    def __init__(
        self, logdir: Path, config: dict[str, Any] | None = None, headline: str = "episode_return_mean"
    ) -> None:
        self.w = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                from torch.utils.tensorboard import SummaryWriter
            self.w = SummaryWriter(log_dir=str(logdir), flush_secs=10)
        except Exception as e:  # noqa: BLE001 - TensorBoard is a convenience, never a reason to stop training
            warnings.warn(f"TensorBoard logging disabled: {e}", stacklevel=2)
        if self.w is not None and config is not None:
            self._write_config(config, headline)

    def _write_config(self, config: dict[str, Any], headline: str) -> None:
        import yaml
        from torch.utils.tensorboard.summary import hparams

        text = yaml.safe_dump(config, sort_keys=False)
        self.w.add_text("config", "".join(f"    {line}\n" for line in text.splitlines()))  # a Markdown code block
        writer = self.w._get_file_writer()
        for summary in hparams(flatten_config(config), {headline: math.nan}):
            writer.add_summary(summary)

    def write(self, result: dict[str, Any]) -> None:
        if self.w is None:
            return
        step = int(result.get("env_steps_sampled", result.get("iteration", 0)))
        for k, v in scalar_items(result):
            self.w.add_scalar(k, v, step)

    def close(self) -> None:
        if self.w is not None:
            self.w.close()


def build_writers(run_dir: Path, config, headline: str) -> list:
    """The writers of a run directory: results.jsonl and progress.csv always, then the loggers
    ``config.logging.writers`` chooses (TensorBoard, W&B, MLflow), which get the resolved config."""
    from shoal.logging.trackers import MlflowWriter, WandbWriter

    data = {"algo": config.algo, **config.to_dict(redact=True)}
    writers: list = [JsonlWriter(run_dir / "results.jsonl"), CsvWriter(run_dir / "progress.csv")]
    try:
        for name in config.logging.writers:
            if name == "tensorboard":
                writers.append(TensorBoardWriter(run_dir, data, headline))
            elif name == "wandb":
                writers.append(WandbWriter(run_dir, data, config.logging.wandb))
            elif name == "mlflow":
                writers.append(MlflowWriter(run_dir, data, config.logging.mlflow))
    except BaseException:
        for w in writers:
            w.close()
        raise
    return writers


def _row_iteration(path: Path, line: str) -> float:
    """A results.jsonl row's iteration; a blank or torn row (a killed writer's last line) is dropped, with a note."""
    if not line.strip():
        return math.inf
    row = parse_row(line)
    if row is None:
        logging.getLogger("shoal.app.trainer").warning(
            "%s: dropped a torn row (%d characters) left by a killed run", path, len(line)
        )
        return math.inf
    return row.get("iteration", 0)


def _csv_iteration(row: list[str], column: int) -> float:
    """A progress.csv row's iteration; a torn or empty one counts as past every iteration (dropped)."""
    try:
        return float(row[column]) if row[column] else math.inf
    except (IndexError, ValueError):
        return math.inf


def truncate_results(run_dir: Path, max_iteration: int) -> None:
    """Drop rows past ``max_iteration`` (written after the checkpoint a resumed run starts from)."""
    jl = run_dir / "results.jsonl"
    if jl.exists():
        rows = [line for line in jl.read_text().splitlines() if _row_iteration(jl, line) <= max_iteration]
        write_text_atomic(jl, "".join(r + "\n" for r in rows))  # a kill now must not lose the run's history
    pc = run_dir / "progress.csv"
    if pc.exists():
        with open(pc, newline="") as f:
            rows = list(csv.reader(f))
        if rows:
            header, body = rows[0], rows[1:]
            it = header.index("iteration") if "iteration" in header else None
            keep = [r for r in body if it is None or _csv_iteration(r, it) <= max_iteration]
            text = io.StringIO(newline="")
            csv.writer(text).writerows([header, *keep])
            write_text_atomic(pc, text.getvalue())
