"""What `shoal evaluate` plays and says: the request, single-agent episodes (recorded or rendered),
two-player games against an opponent, and the one line of figures (or of the video) it prints."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from shoal.app.cli_console import err
from shoal.errors import ConfigError, ShoalError


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
