"""The options of `shoal train` and `shoal evaluate` (``Annotated``, so each command's signature
stays one line per option), the --trust help they share with other commands, and the check of an
output file a flag names."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, List, Optional

import typer

from shoal.errors import ConfigError
from shoal.seeding import MAX_SEED

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


TRUST_HELP = (
    "Import the code this run's config names (its env factory, model, callbacks) and connect where it says "
    "(its Ray cluster, MLflow or W&B server) even though its checkpoint is not signed with your key: only for "
    "a run directory you know. Your own runs need no --trust."
)


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
