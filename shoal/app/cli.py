"""`shoal train | tune | evaluate | export | resume | algos | config | league`.

Errors caused by input (unknown key, bad env id, missing checkpoint...) print one paragraph
and exit with code 2; Ctrl-C saves a checkpoint and exits with 130.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from shoal.errors import ConfigError, EnvError, ShoalError
from shoal.runtime.signals import SaveAborted, StartInterrupted
from shoal.seeding import MAX_SEED

app = typer.Typer(
    name="shoal",
    help="Distributed reinforcement learning on Ray and PyTorch. `shoal algos` lists the algorithms.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, PowerShell
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


VIDEO_SUFFIXES = (".mp4", ".gif", ".webm", ".mkv", ".avi", ".mov")


def _check_output_file(path: Path, flag: str, suffixes: tuple[str, ...] = ()) -> None:
    """A ConfigError, before any work, unless ``path`` can be written as a new file of one of ``suffixes``."""
    if suffixes and path.suffix.lower() not in suffixes:
        raise ConfigError(
            f"{flag} '{path}': '{path.suffix or 'no suffix'}' is not a file type shoal writes there; "
            f"end the name with one of {', '.join(suffixes)}."
        )
    if path.is_dir():
        raise ConfigError(
            f"{flag} '{path}' is a directory; give a file name (e.g. {path / ('out' + (suffixes or ('.pt',))[0])})."
        )
    from shoal.files import unwritable_ancestor

    ancestor = unwritable_ancestor(path.parent)
    if ancestor is not None:
        raise ConfigError(f"{flag} '{path}': '{ancestor}' is not a writable directory; give a path you can write.")


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


OFF_TERMINAL_WIDTH = 100_000  # a pipe, a log file, CI: lines are written whole, never split mid-word


def _console(stderr: bool = False) -> Console:
    """A rich console that wraps at the terminal's width on a terminal (or at ``COLUMNS`` when
    set), and off one writes each line and table row whole, so a path is never split."""
    stream = sys.stderr if stderr else sys.stdout
    if getattr(stream, "isatty", lambda: False)() or os.environ.get("COLUMNS"):
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=OFF_TERMINAL_WIDTH, soft_wrap=True)


out = _console()
err = _console(stderr=True)


def _print_table(table: Table) -> None:
    """``table`` on stdout. On a terminal rich fits it to the width; off one each row is one line
    (never split) and ends with its text: rich pads every row to the longest (~500 columns)."""
    if out.width < OFF_TERMINAL_WIDTH:
        out.print(table)
        return
    with out.capture() as captured:
        out.print(table)
    for line in captured.get().splitlines():
        out.print(line.rstrip(), highlight=False, markup=False, soft_wrap=True)


STOP_KEYS = ("reward", "env_steps", "time_s", "iterations")
TRUST_HELP = (
    "Import the code this run's config names (its env factory, model, callbacks) and connect where it says "
    "(its Ray cluster, MLflow or W&B server) even though its checkpoint is not signed with your key: only for "
    "a run directory you know. Your own runs need no --trust."
)


def _fail(e: ShoalError) -> None:
    # escaped: a message may hold brackets that are not markup (pip install -e '.[video]')
    err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _build_config(algo: Optional[str], config_file: Optional[Path], sets: List[str], flags: dict[str, Any]):
    """defaults < small-machine preset (only when no resources are given) < YAML file < --set < explicit flags.
    ``algo`` None: the config file's ``algo:``.

    Returns (config, stop-from-yaml, preset note or None).
    """
    from shoal.algorithms import get_config_class
    from shoal.config import deep_merge, load_yaml, parse_set_overrides

    data: dict[str, Any] = load_yaml(config_file) if config_file else {}
    yaml_stop = data.pop("stop", None) or {}
    yaml_algo = data.pop("algo", None)
    if algo is None:
        if yaml_algo is None:
            raise ConfigError(
                "No algorithm given: name it (shoal train ppo ...; `shoal algos` lists them)"
                + (f", or add a line `algo: ppo` to '{config_file}'." if config_file else ".")
            )
        algo = str(yaml_algo)
    cfg_cls = get_config_class(algo)
    if yaml_algo is not None and yaml_algo != cfg_cls.algo:
        raise ShoalError(
            f"Config file '{config_file}' is for algorithm '{yaml_algo}', but you asked to train '{algo}'."
        )
    if not isinstance(yaml_stop, dict) or set(yaml_stop) - set(STOP_KEYS):
        raise ShoalError(
            f"Config file '{config_file}': `stop` must be a mapping with keys among {', '.join(STOP_KEYS)}."
        )
    data = deep_merge(data, parse_set_overrides(sets))
    data = deep_merge(data, {k: v for k, v in flags.items() if v is not None and k != "resources"})
    res = {k: v for k, v in flags.get("resources", {}).items() if v is not None}
    if res:
        data = deep_merge(data, {"resources": res})
    preset = cfg_cls.small_machine_preset()
    note = None
    if preset is not None and "resources" not in data:
        # No resources given at all: start from the algorithm's small-machine preset (e.g. Ape-X).
        note = _preset_note(cfg_cls, preset, data)
        data = deep_merge(preset, data)
    if "env" not in data:
        raise ShoalError("No env given: pass --env (e.g. --env CartPole-v1) or set `env:` in a config file.")
    return cfg_cls(**data), yaml_stop, note


def _preset_note(cfg_cls, preset: dict[str, Any], given: dict[str, Any]) -> str:
    """One line: the preset is used, the settings it changes from the defaults, and how to opt out.

    A preset key the user also gave is left out (the user's value wins), and so is one whose
    value is the default anyway: what remains is exactly what the preset changes.
    """
    user = _dotted(given)
    changes = [f"{k}={v}" for k, v in _dotted(preset).items() if k not in user and v != _default(cfg_cls, k)]
    return (
        f"No resources given: starting from {cfg_cls.__name__}.small_machine_preset(), which changes "
        f"{', '.join(changes) or 'nothing'} from the defaults. Give any resources setting (--workers, "
        "--envs-per-worker, --set resources.KEY=VALUE or a `resources:` section) to start from the defaults instead."
    )


def _dotted(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"resources": {"num_workers": 2}}`` -> ``{"resources.num_workers": 2}``."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_dotted(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def _default(model, dotted: str) -> Any:
    """The default of a dotted config key (``resources.num_workers``), reaching into sections."""
    head, _, rest = dotted.partition(".")
    value = model.model_fields[head].get_default(call_default_factory=True)
    return _default(type(value), rest) if rest else value


def _reward_threshold(cfg) -> Optional[float]:
    """The env's reward threshold (its Gymnasium spec's), or None when it has none.

    A multi-agent (PettingZoo) env is no Gymnasium env and has none: for an algorithm that
    checks its env its own way (alpha_star, a multi_agent section) a failure here gives None,
    and building the algorithm reports a bad env. For any other a bad env is reported now,
    before any note about the stop criteria.

    A registered Gymnasium id's threshold is read from its spec, without building the env (building
    the algorithm checks the env next). Anything else is built under the time limit the
    algorithm's own build uses: a constructor that hangs ends the run with a message, not silently.
    """
    import gymnasium as gym

    from shoal.algorithms.base import Algorithm
    from shoal.algorithms.env_checks import EnvBuildTimeout, driver_build_time_limit
    from shoal.envs import env_info
    from shoal.envs.atari import is_ale_id

    if isinstance(cfg.env, str) and cfg.env in gym.envs.registry and not is_ale_id(cfg.env):
        return gym.spec(cfg.env).reward_threshold
    algorithm_cls = type(cfg).algorithm_cls
    gymnasium_env = (
        getattr(cfg, "multi_agent", None) is None
        and algorithm_cls is not None
        and algorithm_cls.describe_env is Algorithm.describe_env
    )
    try:
        with driver_build_time_limit(cfg, "to read its reward threshold"):
            return env_info(cfg.env, cfg.env_config, cfg.env_preprocessing).reward_threshold
    except EnvBuildTimeout:
        raise  # the algorithm's build would hang on it again
    except EnvError:
        if gymnasium_env:
            raise
        return None


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


# ---- shoal train's options (Annotated, so the command's signature stays one line per option) ----
AlgoArg = Annotated[
    Optional[str],
    typer.Argument(
        help="Algorithm to train, e.g. ppo (see `shoal algos`); may be left out when the config file names it "
        "(`algo: ppo`)."
    ),
]
EnvOpt = Annotated[
    Optional[str], typer.Option("--env", "-e", help="Gymnasium id (CartPole-v1) or import path 'pkg.module:make_env'.")
]
WorkersOpt = Annotated[
    Optional[int],
    typer.Option(
        "--workers", "-w", help="Remote rollout actors (resources.num_workers); 0 runs in-process without Ray."
    ),
]
EnvsPerWorkerOpt = Annotated[
    Optional[int],
    typer.Option("--envs-per-worker", help="Vectorized envs per rollout actor (resources.num_envs_per_worker)."),
]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", help="Random seed; with 0 workers the run is reproducible.")]
ConfigOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--config",
        "-c",
        help="YAML file of config keys; may hold a `stop:` mapping (reward, env_steps, time_s, iterations).",
    ),
]
SetOpt = Annotated[
    List[str],
    typer.Option(
        "--set",
        "-s",
        help="Override a config key: --set lr=0.001 --set resources.num_workers=2 (repeatable; dotted keys reach "
        "sections).",
    ),
]
StopRewardOpt = Annotated[
    Optional[float],
    typer.Option(
        "--stop-reward",
        help="Stop when the mean return of the last episode_window episodes (100 unless the config says) reaches R. "
        "Default: the env's reward threshold, "
        "if it has one, also beside other --stop-* criteria (the first criterion met stops the run).",
    ),
]
NoStopRewardOpt = Annotated[
    bool,
    typer.Option(
        "--no-stop-reward",
        help="No reward criterion: neither the env's reward threshold nor a config file's stop.reward.",
    ),
]
StopStepsOpt = Annotated[Optional[int], typer.Option("--stop-steps", help="Stop after N sampled env steps.")]
StopTimeOpt = Annotated[Optional[float], typer.Option("--stop-time", help="Stop after SECONDS of training.")]
StopItersOpt = Annotated[Optional[int], typer.Option("--stop-iters", help="Stop after N iterations.")]
OutDirOpt = Annotated[Path, typer.Option("--out", "-o", help="Parent directory of the run directory.")]
AddressOpt = Annotated[
    Optional[str],
    typer.Option(
        "--address",
        help="Ray cluster to connect to ('auto' or 'ray://host:port'); default starts a local Ray when workers > 0.",
    ),
]
CheckpointEveryOpt = Annotated[int, typer.Option("--checkpoint-every", help="Write a checkpoint every N iterations.")]
KeepCheckpointsOpt = Annotated[
    int, typer.Option("--keep-checkpoints", help="Numbered checkpoints to keep (plus `best`).")
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No live progress display.")]


def _train_stop(cfg: Any, yaml_stop: dict[str, Any], flags: dict[str, Any], no_stop_reward: bool) -> Any:
    """shoal train's stop criteria: the config file's, overridden by --stop-* flags, and the env's reward
    threshold unless a reward is given or --no-stop-reward says none."""
    from shoal.app.trainer import _as_stop

    if no_stop_reward and flags["reward"] is not None:
        raise ConfigError(
            f"--stop-reward {flags['reward']:g} and --no-stop-reward contradict each other; give one of them."
        )
    stop_d = {**yaml_stop, **{k: v for k, v in flags.items() if v is not None}}
    if no_stop_reward:
        stop_d.pop("reward", None)
    elif stop_d.get("reward") is None:
        stop_d["reward"] = _reward_threshold(cfg)
    return _as_stop(stop_d)  # a bad value is a ConfigError (exit 2), not a traceback


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


# ---- shoal evaluate's options ----
EvalPathArg = Annotated[
    Path,
    typer.Argument(
        help="A checkpoint directory, a run directory (its best checkpoint unless --checkpoint says otherwise), or "
        "a `shoal tune` directory (its best trial's latest checkpoint)."
    ),
]
EpisodesOpt = Annotated[int, typer.Option("--episodes", "-n", min=1, help="Episodes (games, with --opponent) to run.")]
CheckpointOpt = Annotated[
    Optional[str],
    typer.Option(
        "--checkpoint",
        help="Which checkpoint of a run directory: best, last (the newest numbered one), or a checkpoint directory "
        "(a path, or a name in the run's checkpoints/).",
    ),
]
StochasticOpt = Annotated[
    Optional[bool],
    typer.Option(
        "--stochastic/--greedy",
        help="Sample actions from the policy (DQN: epsilon-greedy at the checkpoint's epsilon), or take the most "
        "likely one. Default: greedy, except a league on an OpenSpiel game, which samples (its exploitability is "
        "of the sampling policy).",
        show_default=False,
    ),
]
OpponentOpt = Annotated[
    Optional[str],
    typer.Option(
        "--opponent",
        help="Two-player games: play the checkpoint's main policy against random, heuristic (one-step lookahead: "
        "wins, blocks), heuristic2 (also never lets the opponent win on its reply), or another checkpoint (a "
        "path); seats alternate. Default for a two-player game: random.",
    ),
]
VideoOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--video",
        help="Record the episodes to this file (e.g. out.mp4) from render_mode='rgb_array' frames; needs pip "
        "install -e '.\\[video]' in the shoal checkout.",
    ),
]
VideoEpisodesOpt = Annotated[
    Optional[int], typer.Option("--video-episodes", min=1, help="With --video: record only the first K episodes.")
]
VideoLengthOpt = Annotated[
    int,
    typer.Option(
        "--video-length", min=1, help="With --video: at most this many frames (frames stream to the file as they come)."
    ),
]
JsonOpt = Annotated[
    bool,
    typer.Option(
        "--json", help="Print one JSON object with the figures and per-episode returns, and nothing else, on stdout."
    ),
]
RenderOpt = Annotated[
    bool,
    typer.Option("--render", help="Render each episode on screen (render_mode='human'; needs a display and pygame)."),
]
EvalSeedOpt = Annotated[
    Optional[int],
    typer.Option(
        "--seed",
        min=0,
        max=MAX_SEED,
        help="Seed for the evaluation envs and the sampling; episode i resets with seed + i.",
    ),
]
TrustOpt = Annotated[bool, typer.Option("--trust", help=TRUST_HELP)]


@dataclass(frozen=True)
class _EvalRequest:
    """What `shoal evaluate` was asked to play."""

    episodes: int
    deterministic: bool
    opponent: Optional[str]
    video: Optional[Path]
    video_episodes: Optional[int]
    video_length: int
    render: bool
    seed: Optional[int]
    trust: bool
    progress: bool


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


def _video_line(req: _EvalRequest, frames: int) -> str:
    n = req.episodes
    k = min(req.video_episodes or n, n)
    what = f"the first {k} of {n} episodes" if k < n else f"{k} episode{'s' * (k > 1)}"
    cut = f", cut at --video-length {req.video_length}" if frames >= req.video_length else ""
    return f"Video: {req.video} ({frames} frames: {what}{cut})"


def _evaluation_report(p: Path, algo, req: _EvalRequest) -> dict[str, Any]:
    """Play what `shoal evaluate` asked for and return :func:`shoal.app.evaluation.report`'s figures
    (plus ``video_frames`` with a video)."""
    from shoal.app import evaluation as ev

    if not ev.is_game(algo):
        if req.opponent is not None:
            raise ConfigError(
                f"--opponent plays two-player games (PettingZoo envs trained with a multi_agent section or "
                f"alpha_star); {algo.config.env!r} is a single-agent env. Leave --opponent out."
            )
        return _episodes_report(p, algo, req)
    if req.video is not None or req.render:
        raise ConfigError(
            "--video and --render show single-agent episodes; a multi-agent env has no rgb_array recording here."
        )
    n = req.episodes
    if req.opponent is None and len(ev.agents_of(algo)) != 2:
        if not algo.is_multi_agent:  # a league
            raise ConfigError(
                f"shoal evaluate plays a league's main policy in two-player games; {algo.config.env!r} "
                f"has agents {', '.join(ev.agents_of(algo))}."
            )
        returns, lengths, _ = algo.evaluation_episodes(n, explore=not req.deterministic)
        return ev.report(p, algo, returns[:n], lengths[:n], req.deterministic)
    return _games_report(p, algo, req)


def _episodes_report(p: Path, algo, req: _EvalRequest) -> dict[str, Any]:
    """Single-agent episodes, recorded to a video or rendered when asked."""
    from shoal.app import evaluation as ev

    n = req.episodes
    record = min(req.video_episodes or n, n) if req.video is not None else 0
    writer = ev.VideoWriter(req.video, max_frames=req.video_length) if req.video is not None else None

    def episode_done(i: int, ret: float, length: int) -> None:  # a recording (Atari: minutes) shows it advances
        if req.progress and writer is not None:
            err.print(
                f"episode {i + 1}/{n}: return {ret:g}, {length} steps, {writer.count} frames recorded", highlight=False
            )

    try:
        eps = ev.play_episodes(
            algo, n, req.deterministic, record=record, human=req.render, video=writer, on_episode=episode_done
        )
    except Exception as e:  # noqa: BLE001 - rendering needs optional deps; report plainly
        if req.render and not isinstance(e, ShoalError):
            raise ShoalError(
                f"Rendering failed: {e}. Rendering needs a display and the env's render dependencies "
                "(e.g. pip install pygame); run without --render to evaluate only."
            ) from None
        raise
    finally:
        if writer is not None:
            writer.close()
    rep = ev.report(p, algo, eps.returns, eps.lengths, req.deterministic)
    return rep if writer is None else {**rep, "video_frames": writer.count}


def _games_report(p: Path, algo, req: _EvalRequest) -> dict[str, Any]:
    """Two-player games of the checkpoint's main policy against a scripted player or another checkpoint."""
    from shoal.app import evaluation as ev

    opponent = req.opponent or "random"
    other = None
    if opponent not in ev.SCRIPTED_OPPONENTS:
        if not Path(opponent).exists():
            raise ConfigError(
                f"--opponent must be {', '.join(ev.SCRIPTED_OPPONENTS)} or a checkpoint path; "
                f"'{opponent}' is none of these (no such file or directory)."
            )
        other = ev.load_selected(opponent, None, req.seed, req.trust)[1]
    try:
        games = ev.play_games(algo, opponent, req.episodes, req.deterministic, opponent_algo=other)
    finally:
        if other is not None:
            other.stop()
    return ev.report(p, algo, games["returns"], games["lengths"], req.deterministic, games)


def _evaluation_line(rep: dict[str, Any]) -> str:
    how = "greedy" if rep["deterministic"] else "stochastic"
    if "wins" in rep:
        from shoal.app.evaluation import payoff_unit

        unit = payoff_unit(rep["env"])
        meaning = "the chips it won or lost in a hand" if unit else "its return in a game"
        return (
            f"{rep['checkpoint']}: {rep['player']} vs {rep['opponent']} over {rep['episodes']} {how} games: "
            f"{rep['wins']} wins, {rep['draws']} draws, {rep['losses']} losses (win rate {rep['win_rate']:.2f}, "
            f"draw rate {rep['draw_rate']:.2f}, loss rate {rep['loss_rate']:.2f}; mean length {rep['length_mean']:.1f}); "
            f"mean payoff {rep['return_mean']:+.2f}{' ' + unit if unit else ''} per game "
            f"(± {rep['return_std']:.2f}; {meaning}, averaged)"
        )
    return (
        f"{rep['checkpoint']}: mean return {rep['return_mean']:.2f} ± {rep['return_std']:.2f} over "
        f"{rep['episodes']} {how} episodes (min {rep['return_min']:.2f}, max {rep['return_max']:.2f}, "
        f"mean length {rep['length_mean']:.1f})"
    )


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
        from shoal.app.tune_run import load_spec, run_tune

        spec = load_spec(config, set_)
        summary = run_tune(spec, out=out_dir, address=address, verbose=0 if quiet else 1)
    except ShoalError as e:
        _fail(e)
    _print_tune_summary(summary)


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
