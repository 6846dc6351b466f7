"""The paragraphs `shoal train`, `resume` and `tune` print around a run: the notes as it starts,
what an interrupted start or save left, a run that has nothing to train, the summary of how it
ended (with the exit code of a signal), and a tune run's table of trials."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from shoal.app.cli_console import err, out


def _print_summary(s, stop) -> None:
    r = s.result
    steps = r.get("env_steps_sampled", 0)
    ret = r.get("episode_return_mean", math.nan)
    # a league leads with its own figures (the mean return of zero-sum self-play is ~0 however main plays)
    figures = escape(s.summary_lines[0]) if s.summary_lines else f"mean return {ret:.1f}"
    if s.stop_reason == "reward":
        head = f"[bold green]Solved[/]: mean return {ret:.1f} >= {stop.reward:g}"
    elif s.stop_reason in ("interrupted", "terminated"):
        head = f"[yellow]{'Interrupted' if s.stop_reason == 'interrupted' else 'Terminated (SIGTERM)'}[/]: {figures}"
    else:
        target = f" (target {stop.reward:g} not reached)" if stop.reward is not None else ""
        head = f"[yellow]Stopped on {s.stop_reason}[/]: {figures}{target}"
    best = f"{s.best_value:.4g}" if math.isfinite(s.best_value) else "- (never reported)"
    out.print(
        f"{head} after {steps:,} env steps, {r.get('iteration', 0)} iterations, "
        f"{r.get('time_total_s', 0):.1f} s training ({s.wall_s:.1f} s wall). Best {s.best_metric} {best}.",
        highlight=False,
    )
    for line in s.summary_lines[1:]:
        out.print(line, highlight=False, markup=False)
    if s.run_dir:
        out.print(f"Run directory: {s.run_dir}", highlight=False)
        if s.best_checkpoint:
            out.print(f"Best checkpoint: {s.best_checkpoint}   (shoal evaluate {s.run_dir})", highlight=False)


def _start_notes(preset_note: Optional[str], stop) -> None:
    if preset_note:
        err.print(preset_note, highlight=False, soft_wrap=True)
    if stop.is_empty():
        err.print(
            "No stop criterion and the env has no reward threshold: training until Ctrl-C (which saves a "
            "checkpoint). To stop on your terms give --stop-reward R, --stop-steps N, --stop-time SECONDS or "
            "--stop-iters N, or a stop: section in the config.",
            highlight=False,
            soft_wrap=True,
        )


def _start_interrupted(while_: str, state: str) -> None:
    """Ctrl-C before the first iteration: what that left, one paragraph, exit 130."""
    err.print(
        f"Interrupted while the run was {while_}, before its first iteration: nothing was trained and {state}.",
        highlight=False,
        soft_wrap=True,
    )
    raise typer.Exit(130) from None


def _already_met(run_dir: Path, summary) -> None:
    flag = {
        "reward": "--stop-reward (or --no-stop-reward)",
        "env_steps": "--stop-steps",
        "time": "--stop-time",
        "iterations": "--stop-iters",
    }
    out.print(
        f"Nothing to train: {run_dir} at {summary.last_checkpoint.name} already meets its stop criterion "
        f"{summary.stop_detail}. Give a larger {flag[summary.stop_reason]} to go on.",
        highlight=False,
    )


def _save_aborted() -> None:
    err.print(
        "Stopped: the checkpoint being written was abandoned on the third signal; the run's previous "
        "checkpoint is its newest.",
        highlight=False,
        soft_wrap=True,
    )
    raise typer.Exit(130)


def _exit_for(summary) -> None:
    """Exit 130 after Ctrl-C and 143 after SIGTERM, as a shell reports a process those signals ended."""
    from shoal.runtime.signals import EXIT_CODES

    if summary.stop_reason in EXIT_CODES:
        raise typer.Exit(EXIT_CODES[summary.stop_reason])


def _print_tune_summary(summary) -> None:
    table = Table(show_header=True, header_style="bold", box=None)
    for column in ("trial", "params", "iterations", summary.metric, "ended"):
        table.add_column(column, overflow="fold")
    for row in summary.trials:
        params = ", ".join(f"{k}={_short(v)}" for k, v in row["params"].items())
        table.add_row(
            *map(Text, (str(row["trial"]), params, str(row["iterations"]), _short(row["metric"]), row["ended"]))
        )
    out.print(table)
    early, n = len(summary.stopped_early), len(summary.trials)
    finished = sum(r["ended"].startswith("finished") for r in summary.trials)
    if early:  # Tune calls both TERMINATED
        out.print(
            f"{early} of {n} trials were stopped early by the scheduler (the weaker ones at a rung); "
            f"{finished} ran to {'its' if finished == 1 else 'their'} stop.",
            highlight=False,
        )
    out.print(f"Tune results: {summary.run_dir}", highlight=False)
    if summary.best_config is None:
        out.print(f"No trial reported a finite {summary.metric}: no best config.", highlight=False)
        return
    out.print(
        f"Best {summary.metric}: {summary.best_metric:g} (trial {summary.best_trial}); its config: "
        f"{summary.best_config_path} (shoal train {summary.best_config['algo']} -c {summary.best_config_path})",
        highlight=False,
        soft_wrap=True,
    )
    if summary.best_checkpoint is not None:
        out.print(
            f"Its last checkpoint: {summary.best_checkpoint}   (shoal evaluate {summary.run_dir})",
            highlight=False,
            soft_wrap=True,
        )


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else "-" if v is None else str(v)
