"""Learning curves of run directories: ``shoal plot RUN...`` and each run's ``curves.png``.

A run's curve is one result key (the mean return by default) against env steps, training time
or iterations, read from its ``results.jsonl``. Runs whose configs differ only in their seed are
one group: drawn as the mean over the seeds with a band from the lowest to the highest seed, on
the x range all of them reached (each seed's curve interpolated onto a common grid). A run alone
is drawn as it is. The file type follows the output's suffix (``.png``, ``.svg`` or ``.pdf``).
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from shoal.errors import ConfigError, ShoalError
from shoal.logging.results import read_results

log = logging.getLogger("shoal.plot")

X_AXES = {
    "env_steps": ("env_steps_sampled", "env steps sampled"),
    "time": ("time_total_s", "training time (s)"),
    "iteration": ("iteration", "iteration"),
}
SUFFIXES = (".png", ".svg", ".pdf")
GRID_POINTS = 200


@dataclass
class Group:
    """Runs of one config (seeds apart): their label and each run's ``(x, y)`` points."""

    label: str
    runs: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)


def find_runs(paths: list[Path]) -> list[Path]:
    """The run directories ``paths`` name: each a run (it has ``results.jsonl``), or a directory
    whose subdirectories are runs (e.g. ``runs/``)."""
    found: list[Path] = []
    for p in paths:
        if (p / "results.jsonl").is_file():
            found.append(p)
        elif p.is_dir() and (children := sorted(c for c in p.iterdir() if (c / "results.jsonl").is_file())):
            found.extend(children)
        else:
            raise ConfigError(
                f"'{p}' is not a run directory (it has no results.jsonl) and holds none: give run "
                "directories written by `shoal train`, or the directory they are in."
            )
    return found


def read_curve(run: Path, x_key: str, key: str) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` of ``run``'s results rows that have a finite ``key``. Lines that hold no row (the
    torn last line of a killed run, garbage) are skipped, with a warning that counts them."""
    path = run / "results.jsonl"
    rows, bad = read_results(path)
    if bad:
        lines = "1 line that holds" if bad == 1 else f"{bad} lines that hold"
        log.warning("%s: skipped %s no result row (cut short by a killed run, or garbage)", path, lines)
    xs, ys = [], []
    for row in rows:
        x, y = row.get(x_key), row.get(key)
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and math.isfinite(y):
            xs.append(float(x))
            ys.append(float(y))
    return np.asarray(xs), np.asarray(ys)


def _numeric_keys(run: Path) -> list[str]:
    keys: set[str] = set()
    for row in read_results(run / "results.jsonl")[0][:50]:
        keys.update(k for k, v in row.items() if isinstance(v, (int, float)))
    return sorted(keys)


def _config_without_seed(run: Path) -> str:
    """The run's config as text with its seed left out: runs that differ only in the seed agree."""
    f = run / "config.yaml"
    if not f.is_file():
        return str(run)  # a run of its own
    data = yaml.safe_load(f.read_text(encoding="utf-8")) or {}
    data.pop("seed", None)
    return yaml.safe_dump(data, sort_keys=True)


def _label(run: Path) -> str:
    return re.sub(r"_\d{8}-\d{6}([-_]\d+)?$", "", run.name)  # ppo_CartPole-v1_20261122-101500(-1) -> ppo_CartPole-v1


def group_runs(runs: list[Path], x_key: str, key: str, group: bool = True) -> list[Group]:
    """The curves of ``runs``, one group per config (per run when ``group`` is False)."""
    groups: dict[str, Group] = {}
    for run in runs:
        x, y = read_curve(run, x_key, key)
        if len(x) == 0:
            continue
        ident = _config_without_seed(run) if group else str(run)
        if ident not in groups:
            label = _label(run) if group else run.name
            taken = sum(g.label.split(" (")[0] == label for g in groups.values())
            groups[ident] = Group(label if not taken else f"{label} (config {taken + 1})")
        groups[ident].runs.append((x, y))
    return list(groups.values())


def mean_and_band(runs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(grid, mean, low, high)`` of several curves on the x range they all cover."""
    lo = max(float(x[0]) for x, _ in runs)
    hi = min(float(x[-1]) for x, _ in runs)
    grid = np.linspace(lo, hi, GRID_POINTS) if hi > lo else np.asarray([lo])
    ys = np.stack([np.interp(grid, x, y) for x, y in runs])
    return grid, ys.mean(axis=0), ys.min(axis=0), ys.max(axis=0)


def plot_runs(
    paths: list[Path],
    out: Path,
    x: str = "env_steps",
    key: str = "episode_return_mean",
    group: bool = True,
    title: str | None = None,
) -> Path:
    """Draw ``key`` of the runs in ``paths`` against ``x`` into ``out``; returns ``out``."""
    if x not in X_AXES:
        raise ConfigError(f"--x {x!r} is not an axis; choose one of {', '.join(X_AXES)}.")
    out = Path(out)
    if out.suffix.lower() not in SUFFIXES:
        raise ConfigError(f"'{out}': the picture's type follows its suffix; use one of {', '.join(SUFFIXES)}.")
    x_key, x_label = X_AXES[x]
    runs = find_runs([Path(p) for p in paths])
    groups = group_runs(runs, x_key, key, group)
    if not groups:
        reporting = next((r for r in runs if _numeric_keys(r)), None)
        if reporting is None:
            files = ", ".join(f"'{r / 'results.jsonl'}'" for r in runs)
            raise ConfigError(
                f"No results to draw: {files} hold{'s' if len(runs) == 1 else ''} no result rows (a run "
                "writes one per finished iteration); give runs that have finished an iteration."
            )
        raise ConfigError(
            f"No run has a finite '{key}' in its results.jsonl. Keys the run {reporting.name} reports: "
            f"{', '.join(_numeric_keys(reporting))}."
        )
    fig = curves_figure(groups, x_label, key, title)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out)
    except OSError as e:  # a directory that cannot be made (/proc/x), a full disk
        raise ShoalError(f"Cannot write the picture '{out}': {e.strerror or e}; give a path you can write.") from None
    return out


def curves_figure(groups: list[Group], x_label: str, key: str, title: str | None = None):
    """The matplotlib Figure of ``groups``' curves (no pyplot, so no GUI backend). A curve of one
    point (a run that reported ``key`` once, e.g. a league's first evaluation) is a marker, and its
    legend says so: a line through one point draws nothing."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2), dpi=110)
    ax = fig.add_subplot(1, 1, 1)
    for g in groups:
        if len(g.runs) == 1:
            ((xs, ys),) = g.runs
            label = g.label
        else:
            xs, ys, low, high = mean_and_band(g.runs)
            label = f"{g.label} ({len(g.runs)} seeds: mean, min-max)"
        one = len(xs) == 1
        (line,) = ax.plot(xs, ys, marker="o" if one else None, label=label + (" (one point)" if one else ""))
        if len(g.runs) > 1:
            ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel(x_label)
    ax.set_ylabel(key)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig
