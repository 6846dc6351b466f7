"""What ``shoal evaluate`` does: pick a checkpoint, play episodes with its policy, report them.

- :func:`select_checkpoint`: ``best``, ``last`` or a named checkpoint of a run directory;
  :func:`load_selected` opens it once and rebuilds its algorithm (:func:`load_for_evaluation`).
- :func:`play_episodes`: single-agent episodes with :meth:`Algorithm.predict`, greedy or
  sampled, optionally recording the first few as RGB frames to a :class:`VideoWriter`.
- :func:`play_games`: a game checkpoint's main policy against ``random``, ``heuristic`` or
  ``heuristic2`` (the scripted players of :mod:`shoal.envs.multi_agent`) or another checkpoint's main policy, for
  two-player PettingZoo envs trained by a multi-agent algorithm or the AlphaStar league.
- :func:`report`: one dict of the figures (what ``--json`` prints).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from shoal import checkpoint as ckpt
from shoal.envs.multi_agent import LOOKAHEAD_DEPTHS, SCRIPTED_PLAYERS
from shoal.errors import CheckpointError, ConfigError, EnvError, ShoalError
from shoal.rollout.policies import EpsilonGreedyQPolicy

CHECKPOINT_CHOICES = ("best", "last")
SCRIPTED_OPPONENTS = SCRIPTED_PLAYERS
HEURISTIC_ENVS = "connect four (pettingzoo.classic:connect_four_v3) and tic-tac-toe (pettingzoo.classic:tictactoe_v3)"


# ---- which checkpoint -----------------------------------------------------------------------------
def _checkpoint_names(d: Path) -> list[str]:
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.iterdir() if (p / ckpt.META_FILE).is_file() and (p / ckpt.STATE_FILE).is_file())


def tune_best_trial(path: Path) -> tuple[Path, str | None]:
    """``path``, or for a ``shoal tune`` run directory its best trial's directory (whose latest
    checkpoint is the one evaluated) and the words saying which trial that is."""
    from shoal.app.tune_trials import best_trial_dir, is_tune_dir

    if not is_tune_dir(path):
        return path, None
    return best_trial_dir(path)


def select_checkpoint(path: str | Path, choice: str | None = None) -> Path:
    """The checkpoint to evaluate.

    ``choice`` None: ``path`` itself when it is a checkpoint, else its run's best checkpoint (or
    its latest one when there is no best); a ``shoal tune`` directory stands for its best trial
    (:func:`tune_best_trial`), whose latest checkpoint that is. ``"best"``: the run's ``checkpoints/best``;
    ``"last"``: its newest complete numbered checkpoint; anything else names a checkpoint
    directory, as a path or as a name inside the run's ``checkpoints/``.
    """
    p = tune_best_trial(Path(path))[0]
    if choice is None:
        return ckpt.resolve_checkpoint(p, prefer="best")
    if not p.exists():
        raise CheckpointError(f"Checkpoint path '{p}' does not exist.")
    d = p / "checkpoints" if (p / "checkpoints").is_dir() else p
    if choice not in CHECKPOINT_CHOICES:
        for candidate in (Path(choice), d / choice):
            if (candidate / ckpt.META_FILE).is_file():
                return candidate
        raise CheckpointError(
            f"--checkpoint '{choice}' is neither best, last, a checkpoint directory nor one of the "
            f"checkpoints in '{d}' ({', '.join(_checkpoint_names(d)) or 'none'})."
        )
    if (p / ckpt.META_FILE).is_file():
        raise CheckpointError(
            f"'{p}' is a checkpoint itself; --checkpoint {choice} picks a checkpoint of a run "
            "directory. Pass the run directory, or leave --checkpoint out."
        )
    numbered = [c for c in ckpt.list_checkpoints(d) if (c / ckpt.STATE_FILE).is_file()]
    tune_trial = sorted(
        c / ckpt.TUNE_CHECKPOINT_NAME for c in p.glob("checkpoint_*") if (c / ckpt.TUNE_CHECKPOINT_NAME).is_dir()
    )  # a Tune trial's checkpoint_00000N/shoal: numbered, no best
    numbered = numbered or [c for c in tune_trial if (c / ckpt.STATE_FILE).is_file()]
    found = (d / "best") if choice == "best" else (numbered[-1] if numbered else None)
    if found is None or not (found / ckpt.META_FILE).is_file() or not (found / ckpt.STATE_FILE).is_file():
        what = "checkpoints/best" if choice == "best" else "numbered checkpoint"
        if tune_trial and choice == "best":
            raise CheckpointError(
                f"--checkpoint best: '{p}' is a Tune trial, which keeps no best checkpoint; "
                "--checkpoint last (or none) evaluates its latest."
            )
        raise CheckpointError(
            f"--checkpoint {choice}: '{p}' has no {what}. Checkpoints there: "
            f"{', '.join(_checkpoint_names(d)) or 'none'}."
        )
    return found


def load_for_evaluation(path: str | Path | ckpt.OpenedCheckpoint, seed: int | None = None, trust: bool = False):
    """The algorithm of checkpoint ``path`` (a run directory: its best; an opened checkpoint: not read
    again), rebuilt to run in this process (no rollout or evaluation actors; an algorithm that needs
    workers, DD-PPO, keeps them but starts none), ``seed`` replacing its seed.
    ``trust``: import the code its config names even if the checkpoint is not signed with your key."""
    from shoal.algorithms import get_config_class
    from shoal.app.trainer import load

    opened = ckpt.open_checkpoint(path, prefer="best")
    cfg_cls = get_config_class(opened.meta["algo"])
    overrides: dict[str, Any] = {"resources": {"num_workers": 0}} if cfg_cls.min_workers == 0 else {}
    evaluation_cls = cfg_cls.model_fields["evaluation"].annotation
    if "evaluation_num_workers" not in evaluation_cls.unused_keys:
        overrides["evaluation"] = {"evaluation_num_workers": 0}
    if seed is not None:
        overrides["seed"] = seed
    return load(opened, overrides=overrides, trust=trust)


def load_selected(
    path: str | Path, choice: str | None = None, seed: int | None = None, trust: bool = False
) -> tuple[Path, Any]:
    """``(checkpoint, algorithm)``: :func:`select_checkpoint`'s checkpoint of ``path``, opened once
    (:func:`shoal.checkpoint.open_checkpoint`) and rebuilt by :func:`load_for_evaluation`. The opened
    checkpoint, and the state it loaded, are not kept: the algorithm holds what it restored."""
    opened = ckpt.open_checkpoint(select_checkpoint(path, choice), resolve=False)
    return opened.path, load_for_evaluation(opened, seed, trust)


# ---- single-agent episodes ------------------------------------------------------------------------
@dataclass
class Episodes:
    """Per-episode returns and lengths; ``frames`` holds the recorded episodes' RGB frames when no
    video writer took them, ``fps`` the frame rate the env declares (``metadata["render_fps"]``, else 30)."""

    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    frames: list[np.ndarray] = field(default_factory=list)
    fps: float = 30.0


def _make_eval_env(cfg, render_mode: str | None):
    from shoal.envs import make_env

    if render_mode != "rgb_array":
        kwargs = {"render_mode": render_mode} if render_mode else {}
        return make_env(cfg.env, cfg.env_config, preprocessing=cfg.env_preprocessing, **kwargs)
    # Frames drawn off screen need no display: pygame's dummy video driver, so SDL does not look
    # for one (and print "XDG_RUNTIME_DIR is invalid or not set" where there is none).
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    try:
        env = make_env(cfg.env, cfg.env_config, preprocessing=cfg.env_preprocessing, render_mode="rgb_array")
    except EnvError as e:
        raise EnvError(
            f"Cannot record a video: env {cfg.env!r} cannot be built with render_mode='rgb_array' ({e})."
        ) from None
    if env.render_mode != "rgb_array":
        env.close()
        raise EnvError(
            f"Cannot record a video: env {cfg.env!r} does not render rgb_array frames "
            f"(its render_mode is {env.render_mode!r})."
        )
    return env


def _frame(env) -> np.ndarray:
    frame = env.render()
    if not isinstance(frame, np.ndarray) or frame.ndim != 3 or frame.shape[2] not in (3, 4):
        raise EnvError(
            f"Cannot record a video: the env's render() gave {type(frame).__name__} "
            f"{getattr(frame, 'shape', '')}, not an (H, W, 3) RGB frame."
        )
    return frame[:, :, :3]


def play_episodes(
    algo,
    num_episodes: int,
    deterministic: bool = True,
    record: int = 0,
    human: bool = False,
    video: "VideoWriter | None" = None,
    on_episode: Callable[[int, float, int], None] | None = None,
) -> Episodes:
    """``num_episodes`` episodes of ``algo``'s single-agent policy on one env, in this process.

    Episode ``i`` starts from ``reset(seed=config.seed + i)`` (unseeded without a seed), so a
    greedy policy repeats exactly. The first ``record`` episodes are rendered (``rgb_array``;
    for Atari the emulator's full-size RGB screen, not the preprocessed network input): one
    frame after the reset and one after every step, streamed to ``video`` as they come (and no
    more once it is full), or kept in ``Episodes.frames`` without one. ``human`` shows the
    episodes on screen instead. ``on_episode(i, return, length)`` is called as each one ends.
    """
    if algo.policy_cls is None or getattr(algo, "is_multi_agent", False):
        raise ConfigError(f"{type(algo).__name__} has no single-agent policy to play episodes with.")
    if not deterministic and algo.policy_cls is EpsilonGreedyQPolicy and not algo.config.epsilon_schedule():
        raise ConfigError(
            f"--stochastic: {type(algo).__name__}'s actors explore with fixed epsilons of their own, so "
            "its policy has no epsilon to sample with; evaluate it greedily (leave --stochastic out)."
        )
    seed = algo.config.seed
    env = _make_eval_env(algo.config, "rgb_array" if record > 0 else "human" if human else None)
    out = Episodes(fps=_video_fps(algo.config, env))
    if video is not None and video.fps is None:
        video.fps = out.fps
    keep = out.frames.append if video is None else video.add

    def recording(i: int) -> bool:
        return i < record and (video is None or not video.full)

    try:
        for i in range(num_episodes):
            obs, info = env.reset(seed=None if seed is None else seed + i)
            if recording(i):
                keep(_frame(env))
            state, done, ret, n = None, False, 0.0, 0
            while not done:
                mask = info.get("action_mask")  # an env's legal actions (a Dict observation's are read by predict)
                action, state = algo.predict(obs, state, deterministic=deterministic, action_mask=mask)
                obs, r, term, trunc, info = env.step(action)
                ret, n, done = ret + float(r), n + 1, bool(term or trunc)
                if recording(i):
                    keep(_frame(env))
            out.returns.append(ret)
            out.lengths.append(n)
            if on_episode is not None:
                on_episode(i, ret, n)
    finally:
        env.close()
    return out


def _video_fps(cfg, env) -> float:
    """The env's ``render_fps`` (30 when it declares none). An Atari game is recorded once per
    ``frame_skip`` frames of the 60 Hz console, so its video plays at 60 / frame_skip: real speed."""
    from shoal.envs.atari import is_ale_id

    if is_ale_id(cfg.env):
        return 60.0 / cfg.env_preprocessing.frame_skip
    return float(env.metadata.get("render_fps") or 30)


class VideoWriter:
    """RGB frames streamed to a video file (mp4, gif, ... by its suffix) with imageio as they
    come, so memory holds one frame whatever the length; at most ``max_frames`` (None: all).
    The file is opened by the first frame: a run that fails before rendering leaves none."""

    def __init__(self, path: str | Path, fps: float | None = None, max_frames: int | None = None) -> None:
        """``fps`` None: the frame rate :func:`play_episodes` reads from the env."""
        try:
            import imageio.v2 as imageio
        except ImportError:
            raise ShoalError(
                "--video needs imageio and imageio-ffmpeg: pip install -e '.[video]' in the shoal checkout."
            ) from None
        self.path, self.max_frames, self.count = Path(path), max_frames, 0
        self.fps = fps
        self._kwargs: dict[str, Any] = {}
        if self.path.suffix.lower() in (".mp4", ".mkv", ".avi", ".mov"):
            try:
                import imageio_ffmpeg  # noqa: F401
            except ImportError:
                raise ShoalError(
                    "--video to an mp4 file needs imageio-ffmpeg: pip install -e '.[video]' in the shoal checkout."
                ) from None
            self._kwargs["macro_block_size"] = 2  # even sizes suffice for H.264; no resizing of frames such as 600x400
        self._imageio = imageio
        self._writer: Any = None

    @property
    def full(self) -> bool:
        return self.max_frames is not None and self.count >= self.max_frames

    def add(self, frame: np.ndarray) -> None:
        if self.full:
            return
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = self._imageio.get_writer(self.path, fps=self.fps or 30.0, **self._kwargs)
        self._writer.append_data(frame)
        self.count += 1

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> "VideoWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ---- games ------------------------------------------------------------------------------------
def is_game(algo) -> bool:
    """Whether ``algo`` plays a multi-agent (PettingZoo) env: a league or a multi-agent algorithm."""
    return algo.is_league or algo.is_multi_agent


def payoff_unit(env: Any) -> str:
    """The unit of a game's return, as the evaluate line names it: "chips" in poker (OpenSpiel's
    utilities: a hand's net winnings), else "" (the board games pay +1 a win, 0 a draw, -1 a loss)."""
    return "chips" if "poker" in str(env) else ""


def main_policy(algo) -> tuple[str, dict[str, Any]]:
    """A game checkpoint's main policy: ``main`` when there is one, else the first policy; and the
    spec a :class:`~shoal.rollout.multi_agent.MultiAgentEnvRunner` builds it from."""
    ids = algo.policies.ids
    pid = "main" if "main" in ids else ids[0]
    spec = {
        "weights": algo.policies.weights(pid),
        "model": algo.policies.configs[pid].model.model_dump(),
        "trainable": False,
    }
    if not algo.is_league:  # a league's players take either seat; a multi_agent section's policy plays its agent
        spec["agent"] = algo.agents.agent_for(pid)
    return pid, spec


def agents_of(algo) -> list[str]:
    """The agents of ``algo``'s multi-agent env."""
    from shoal.envs.multi_agent import make_multi_agent_env

    env = make_multi_agent_env(algo.config.env, algo.config.env_config)
    try:
        return list(env.possible_agents)
    finally:
        env.close()


def play_games(algo, opponent: str, num_games: int, deterministic: bool = True, opponent_algo=None) -> dict[str, Any]:
    """``algo``'s main policy against ``opponent`` ("random", "heuristic", "heuristic2", or ``opponent_algo``'s
    main policy) for ``num_games`` games, taking the first seat in every other game:
    :meth:`MultiAgentEnvRunner.evaluate_vs`'s summary plus ``player`` and ``opponent``."""
    from shoal.rollout.multi_agent import MultiAgentEnvRunner

    agents = agents_of(algo)
    if len(agents) != 2:
        raise ConfigError(
            f"--opponent plays two-player games; {algo.config.env!r} has {len(agents)} agents ({', '.join(agents)})."
        )
    pid, spec = main_policy(algo)
    specs = {"player": spec}
    if opponent_algo is not None:
        if opponent_algo.config.env != algo.config.env:
            raise ConfigError(f"The opponent checkpoint plays {opponent_algo.config.env!r}, not {algo.config.env!r}.")
        opponent_name, specs["opponent"] = main_policy(opponent_algo)
        opp_id = "opponent"
    else:
        opponent_name = opp_id = opponent
    runner = MultiAgentEnvRunner(algo.config, 999, specs, matchmaking=[{"policies": ["player"]}], num_envs=1)
    try:
        out = runner.evaluate_vs("player", opp_id, num_games, explore=not deterministic, num_envs=min(num_games, 16))
    except EnvError as e:
        if opponent in LOOKAHEAD_DEPTHS:
            raise EnvError(f"--opponent {opponent}: {e} The heuristic opponents play {HEURISTIC_ENVS}.") from None
        raise
    finally:
        runner.stop()
    return {**out, "player": pid, "opponent": opponent_name}


# ---- the report -------------------------------------------------------------------------------
def report(
    checkpoint: Path,
    algo,
    returns: Sequence[float],
    lengths: Sequence[float],
    deterministic: bool,
    games: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The figures ``shoal evaluate`` prints (``--json``: exactly this object) of at least one episode."""
    r = np.asarray(returns, dtype=np.float64)
    out: dict[str, Any] = {
        "checkpoint": str(checkpoint),
        "algo": algo.config.algo,
        "env": str(algo.config.env),
        "episodes": len(returns),
        "deterministic": deterministic,
        "return_mean": float(r.mean()),
        "return_std": float(r.std()),
        "return_min": float(r.min()),
        "return_max": float(r.max()),
        "length_mean": float(np.mean(lengths)),
        "returns": r.tolist(),
    }
    if games is not None:
        out.update(
            {
                k: games[k]
                for k in (
                    "player",
                    "opponent",
                    "wins",
                    "draws",
                    "losses",
                    "win_rate",
                    "draw_rate",
                    "loss_rate",
                    "win_rate_first",
                    "win_rate_second",
                )
            }
        )
    return out


__all__ = [
    "CHECKPOINT_CHOICES",
    "Episodes",
    "SCRIPTED_OPPONENTS",
    "agents_of",
    "is_game",
    "load_for_evaluation",
    "load_selected",
    "main_policy",
    "play_episodes",
    "payoff_unit",
    "play_games",
    "report",
    "select_checkpoint",
    "tune_best_trial",
    "VideoWriter",
]
