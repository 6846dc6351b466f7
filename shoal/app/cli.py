"""`shoal train | tune | evaluate | export | resume | algos | config | league`.

Errors caused by input (unknown key, bad env id, missing checkpoint...) print one paragraph
and exit with code 2; Ctrl-C saves a checkpoint and exits with 130.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from shoal.app.cli_config import STOP_KEYS, _build_config, _train_stop
from shoal.app.cli_console import _fail, _print_table, err, out
from shoal.app.cli_evaluate import _EvalRequest, _evaluation_line, _evaluation_report, _video_line
from shoal.app.cli_options import (
    TRUST_HELP,
    VIDEO_SUFFIXES,
    AddressOpt,
    AlgoArg,
    CheckpointEveryOpt,
    CheckpointOpt,
    ConfigOpt,
    EnvOpt,
    EnvsPerWorkerOpt,
    EpisodesOpt,
    EvalPathArg,
    EvalSeedOpt,
    JsonOpt,
    KeepCheckpointsOpt,
    NoStopRewardOpt,
    OpponentOpt,
    OutDirOpt,
    QuietOpt,
    RenderOpt,
    SeedOpt,
    SetOpt,
    StochasticOpt,
    StopItersOpt,
    StopRewardOpt,
    StopStepsOpt,
    StopTimeOpt,
    TrustOpt,
    VideoEpisodesOpt,
    VideoLengthOpt,
    VideoOpt,
    WorkersOpt,
    _check_output_file,
)
from shoal.app.cli_reports import (
    _already_met,
    _exit_for,
    _print_summary,
    _print_tune_summary,
    _save_aborted,
    _start_interrupted,
    _start_notes,
)
from shoal.errors import ConfigError, ShoalError
from shoal.runtime.signals import SaveAborted, StartInterrupted

app = typer.Typer(
    name="shoal",
    help="Distributed reinforcement learning on Ray and PyTorch. `shoal algos` lists the algorithms.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, PowerShell
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        from shoal import __version__

        out.print(f"shoal {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", "-V", callback=_print_version, is_eager=True, help="Print shoal's version and exit."
    ),
) -> None:
    """Distributed reinforcement learning on Ray and PyTorch. `shoal algos` lists the algorithms."""


@app.command()
def train(
    algo: AlgoArg = None,
    env: EnvOpt = None,
    workers: WorkersOpt = None,
    envs_per_worker: EnvsPerWorkerOpt = None,
    seed: SeedOpt = None,
    config: ConfigOpt = None,
    set_: SetOpt = [],  # noqa: B006 - typer reads the default; never mutated
    stop_reward: StopRewardOpt = None,
    no_stop_reward: NoStopRewardOpt = False,
    stop_steps: StopStepsOpt = None,
    stop_time: StopTimeOpt = None,
    stop_iters: StopItersOpt = None,
    out_dir: OutDirOpt = Path("runs"),
    address: AddressOpt = None,
    checkpoint_every: CheckpointEveryOpt = 10,
    keep_checkpoints: KeepCheckpointsOpt = 3,
    quiet: QuietOpt = False,
) -> None:
    """Train an algorithm; writes runs/<algo>_<env>_<timestamp>/ with results, TensorBoard events and checkpoints."""
    try:
        from shoal.app.trainer import train as run_train

        cfg, yaml_stop, preset_note = _build_config(
            algo,
            config,
            set_,
            {
                "env": env,
                "seed": seed,
                "resources": {"num_workers": workers, "num_envs_per_worker": envs_per_worker, "address": address},
            },
        )
        flags = dict(zip(STOP_KEYS, (stop_reward, stop_steps, stop_time, stop_iters)))
        stop = _train_stop(cfg, yaml_stop, flags, no_stop_reward)

        summary = run_train(
            cfg,
            stop,
            out=out_dir,
            checkpoint_every=checkpoint_every,
            keep_checkpoints=keep_checkpoints,
            progress=not quiet,
            config_note=preset_note,
            on_start=lambda: _start_notes(preset_note, stop),  # once the run starts: a config that
        )  # fails to build shows only its error
    except ShoalError as e:
        _fail(e)
    except SaveAborted:
        _save_aborted()
    except StartInterrupted:
        _start_interrupted(
            "starting (building the algorithm, starting Ray and the actors)", "no run directory was written"
        )
    _print_summary(summary, stop)
    _exit_for(summary)


@app.command()
def evaluate(
    path: EvalPathArg,
    episodes: EpisodesOpt = 10,
    checkpoint: CheckpointOpt = None,
    stochastic: StochasticOpt = None,
    opponent: OpponentOpt = None,
    video: VideoOpt = None,
    video_episodes: VideoEpisodesOpt = None,
    video_length: VideoLengthOpt = 1000,
    as_json: JsonOpt = False,
    render: RenderOpt = False,
    seed: EvalSeedOpt = None,
    trust: TrustOpt = False,
) -> None:
    """Load a checkpoint and report its returns over N episodes: greedy or sampled, recorded to a video, or games against an opponent."""
    from shoal.app.evaluation import load_selected, tune_best_trial

    try:
        if video_episodes is not None and video is None:
            raise ConfigError("--video-episodes says how many episodes to record; give --video FILE too.")
        if video is not None:
            _check_output_file(video, "--video", VIDEO_SUFFIXES)
        trial, picked = tune_best_trial(path)
        if picked is not None:  # on stderr: --json keeps stdout one object
            err.print(f"{path} is a `shoal tune` run: evaluating {picked}.", highlight=False, soft_wrap=True)
        p, algo = load_selected(trial, checkpoint, seed, trust)  # the checkpoint opened and read once
        try:
            samples = algo.samples_when_evaluated()  # a league on an OpenSpiel game
            deterministic = not (samples if stochastic is None else stochastic)
            req = _EvalRequest(
                episodes, deterministic, opponent, video, video_episodes, video_length, render, seed, trust, not as_json
            )
            rep = _evaluation_report(p, algo, req)
        finally:
            algo.stop()
    except ShoalError as e:
        _fail(e)
    if as_json:
        import json

        print(json.dumps(rep))
        return
    out.print(_evaluation_line(rep), highlight=False)
    if samples:  # which policy the figures are of, beside the league's exploitability
        out.print(
            "Sampled actions (the default here): the policy the league trains and whose exploitability it reports; "
            "--greedy plays the most likely action, a different player."
            if not req.deterministic
            else "Greedy actions (--greedy): the league's exploitability is of its sampling policy, a different player.",
            highlight=False,
        )
    if video is not None:
        out.print(_video_line(req, rep["video_frames"]), highlight=False)


@app.command("export")
def export_cmd(
    path: Path = typer.Argument(..., help="A checkpoint directory, or a run directory (its best checkpoint)."),
    fmt: str = typer.Option(
        "torchscript",
        "--format",
        "-f",
        help="torchscript (torch.jit.load runs it) or onnx (onnxruntime; needs pip install -e '.\\[export]' in the shoal checkout).",
    ),
    out_file: Optional[Path] = typer.Option(
        None, "--out", "-o", help="File to write; default policy.pt / policy.onnx in the checkpoint directory."
    ),
    trust: bool = typer.Option(False, "--trust", help=TRUST_HELP),
) -> None:
    """Export a checkpoint's policy for deployment: raw observations in, greedy action (and logits/Q-values, value) out."""
    from shoal.app.export import export_policy, sidecar_path

    try:
        if out_file is not None:
            _check_output_file(out_file, "--out")
        written = export_policy(path, fmt, out_file, trust=trust)
    except ShoalError as e:
        _fail(e)
    out.print(f"Wrote {written} ({fmt}) and {sidecar_path(written)} (inputs, outputs, spaces)", highlight=False)


@app.command()
def resume(
    run_dir: Path = typer.Argument(..., help="Run directory written by `shoal train`."),
    stop_reward: Optional[float] = typer.Option(None, "--stop-reward", help="Replace the run's reward criterion."),
    stop_steps: Optional[int] = typer.Option(
        None, "--stop-steps", help="Replace the run's env-step criterion (total, counting the steps already done)."
    ),
    stop_time: Optional[float] = typer.Option(
        None, "--stop-time", help="Replace the run's time criterion (total training seconds)."
    ),
    stop_iters: Optional[int] = typer.Option(
        None, "--stop-iters", help="Replace the run's iteration criterion (total)."
    ),
    no_stop_reward: bool = typer.Option(
        False, "--no-stop-reward", help="Drop the run's reward criterion (the env's reward threshold or the one given)."
    ),
    workers: Optional[int] = typer.Option(None, "--workers", "-w", help="Change the number of rollout actors."),
    set_: List[str] = typer.Option(
        [],
        "--set",
        "-s",
        help="Change a key that may change mid-run (those Tune's PBT perturbs: lr, grad_clip, entropy_coeff...; an error lists the algorithm's): --set lr=0.0001.",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No live progress display."),
    trust: bool = typer.Option(False, "--trust", help=TRUST_HELP),
) -> None:
    """Continue a run from its latest checkpoint, keeping its counters and appending to its files."""
    try:
        from shoal.app.trainer import Stop
        from shoal.app.trainer import resume as run_resume
        from shoal.config import parse_set_overrides

        given = {k: v for k, v in zip(STOP_KEYS, (stop_reward, stop_steps, stop_time, stop_iters)) if v is not None}
        overrides = {"resources": {"num_workers": workers}} if workers is not None else None
        summary = run_resume(
            run_dir,
            stop=given or None,
            overrides=overrides,
            progress=not quiet,
            trust=trust,
            changes=parse_set_overrides(set_),
            no_stop_reward=no_stop_reward,
        )
        if summary.already_met:
            _already_met(run_dir, summary)
            return
        from shoal.files import safe_yaml

        stop = Stop(**(safe_yaml((run_dir / "run.yaml").read_text()) or {}).get("stop", {}))
    except ShoalError as e:
        _fail(e)
    except SaveAborted:
        _save_aborted()
    except StartInterrupted:
        _start_interrupted(
            "resuming (rebuilding the algorithm from its checkpoint, starting Ray and the actors)",
            f"the run is as its checkpoint left it; continue with `shoal resume {run_dir}`",
        )
    _print_summary(summary, stop)
    _exit_for(summary)


@app.command()
def tune(
    config: Path = typer.Option(
        ...,
        "--config",
        "-c",
        help="Tune file: algo, config, search, num_samples, scheduler, metric, mode, stop, max_concurrent_trials (see docs/guide/tune.md).",
    ),
    set_: List[str] = typer.Option(
        [],
        "--set",
        "-s",
        help="Override a key of the tune file: --set config.lr=0.001 --set num_samples=4 --set stop.iterations=5.",
    ),
    out_dir: Path = typer.Option(Path("runs"), "--out", "-o", help="Parent directory of the tune run's directory."),
    address: Optional[str] = typer.Option(
        None, "--address", help="Ray cluster to connect to ('auto' or 'ray://host:port'); default starts a local Ray."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines while the trials run."),
) -> None:
    """Search over an algorithm's config with Ray Tune (grid/random search, ASHA, PBT); prints every trial and writes best_config.yaml."""
    try:
        from shoal.app.tune_run import run_tune
        from shoal.app.tune_spec import load_spec

        spec = load_spec(config, set_)
        summary = run_tune(spec, out=out_dir, address=address, verbose=0 if quiet else 1)
    except ShoalError as e:
        _fail(e)
    _print_tune_summary(summary)


@app.command()
def plot(
    runs: List[Path] = typer.Argument(..., help="Run directories (or directories of runs, e.g. runs/)."),
    x: str = typer.Option("env_steps", "--x", help="The x axis: env_steps, time (training seconds) or iteration."),
    key: str = typer.Option(
        "episode_return_mean", "--key", "-k", help="The result key to draw (any number in results.jsonl)."
    ),
    out_file: Path = typer.Option(Path("curves.png"), "--out", "-o", help="The picture: .png, .svg or .pdf."),
    no_group: bool = typer.Option(
        False, "--no-group", help="One curve per run, even for runs of one config with different seeds."
    ),
    title: Optional[str] = typer.Option(None, "--title", help="A title above the curves."),
) -> None:
    """Learning curves of one or many runs; runs of one config with different seeds are drawn as their mean with a min-max band."""
    from shoal.app.plotting import SUFFIXES, plot_runs

    try:
        _check_output_file(out_file, "--out", SUFFIXES)
        path = plot_runs(runs, out_file, x=x, key=key, group=not no_group, title=title)
    except ShoalError as e:
        _fail(e)
    out.print(f"Curves: {path}", highlight=False)


@app.command("config")
def config_reference(
    algo: str = typer.Argument(..., help="Algorithm name (see `shoal algos`)."),
    as_yaml: bool = typer.Option(False, "--yaml", help="Print a complete config file, each key under its description."),
) -> None:
    """Every config key of ALGO, nested sections too: type, default and what it does."""
    from shoal.algorithms import get_config_class
    from shoal.config_reference import commented_yaml, key_reference

    try:
        cls = get_config_class(algo)
    except ShoalError as e:
        _fail(e)
    if as_yaml:
        out.print(
            f"# shoal train {algo} -c this_file.yaml\nalgo: {algo}\n"
            + commented_yaml(cls, required={"env": "CartPole-v1"}),
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        return
    table = Table(show_header=True, header_style="bold", box=None)
    for column in ("key", "type", "default", "description"):
        table.add_column(column, overflow="fold")
    for row in key_reference(cls):
        table.add_row(*map(Text, row))  # plain text: a description's [brackets] are not rich markup
    _print_table(table)


@app.command()
def algos() -> None:
    """List the algorithms, one line each."""
    from shoal.algorithms import describe

    table = Table(show_header=True, header_style="bold", box=None)
    table.add_column("algorithm")
    table.add_column("description")
    for name, desc in describe().items():
        table.add_row(Text(name), Text(desc))
    _print_table(table)


@app.command()
def league(
    run_dir: Path = typer.Argument(
        ..., help="Run directory (or checkpoint) of a league run, e.g. `shoal train alpha_star`."
    ),
) -> None:
    """Show a league: players, match counts, the win-rate table; writes league_report.* and a heatmap PNG there."""
    from shoal.league.report import format_league_report, write_league_report

    try:
        if not run_dir.exists():
            from shoal.errors import CheckpointError

            raise CheckpointError(f"'{run_dir}' does not exist; give the run directory `shoal train` wrote.")
        report = write_league_report(run_dir)
    except ShoalError as e:
        _fail(e)
    out.print(format_league_report(report), highlight=False, soft_wrap=True)
    for kind, path in report["files"].items():
        out.print(f"{kind}: {path}", highlight=False)
    if report.get("heatmap_message"):
        out.print(report["heatmap_message"], highlight=False)


def main() -> None:
    # 'module:Class' envs, models and leagues from the directory shoal starts in. Appended, never put
    # first: a gymnasium.py or torch.py there must not shadow the installed package.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        app()
    except ShoalError as e:  # raised outside a command body
        err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        sys.exit(2)


if __name__ == "__main__":
    main()
