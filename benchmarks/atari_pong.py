"""Pong from scratch: time and agent steps until the mean of the last 20 finished games first reaches +18.

    python benchmarks/atari_pong.py [--budget-s 3600] [--algo appo] [--config examples/appo_pong.yaml]
                                    [--seed K] [--out-dir benchmarks/results]

Trains in a fresh Python process (start-up counts) from the algorithm's preset
``examples/<algo>_pong.yaml`` with the standard preprocessing; the score is the raw game score
(-21..21) of whole games. Progress goes to stderr; the last stdout line is one JSON object:
``algo``; ``env`` (the preset's id: ``PongNoFrameskip-v4`` is the published anchors' setting,
no sticky actions); ``repeat_action_probability`` (the preset's sticky-action probability;
null: the id's own, 0.25 for v5, 0 for NoFrameskip-v4); ``budget_s``; ``reached`` (bool);
``seconds_to_18`` and ``agent_steps_to_18`` (null if not reached; agent steps = frames /
frame skip); ``best_mean_20``; ``frames`` (emulator frames sampled); ``agent_steps``;
``frames_per_s``; ``learner_busy_fraction`` (Ape-X: the learner thread's mean busy share over
the iterations in which it trained; null for the others); ``curve`` (``[seconds, frames, mean
of the last 20 games]`` after each iteration); and ``png``, the learning curve drawn beside
the JSON in ``--out-dir`` (``atari_pong_<algo>.json`` and ``.png``: the mean of the last 20
games against frames and against minutes); ``final_mean_20`` (the mean of the last 20 games
when the run ended), ``target`` and ``seed`` (``--seed``, else the config's, else 0).

``--seed K`` replaces the config's seed; its files get a ``_seed<K>`` suffix so the runs of one
preset over seeds sit side by side.

Other games: ``--config examples/appo_breakout.yaml --no-target`` trains the whole budget
(``target`` null, ``reached`` false) and names its files after the config
(``atari_appo_breakout.json``); ``--target X`` stops at another score.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from _spawn import run_child

REPO = Path(__file__).resolve().parent.parent
TARGET = 18.0
WINDOW = 20


def log(msg: str) -> None:
    print(f"[atari_pong] {msg}", file=sys.stderr, flush=True)


def child(
    algo_name: str, config_path: str, budget_s: float, spawn_time: float, target: float | None, seed: int | None
) -> dict:
    import numpy as np
    import torch

    from shoal import runtime
    from shoal.algorithms import get_config_class
    from shoal.config import load_yaml

    torch.set_num_threads(1)
    data = load_yaml(config_path)
    data.pop("stop", None)
    if data.pop("algo", algo_name) != algo_name:
        raise SystemExit(f"{config_path} is not a config for '{algo_name}'")
    if seed is not None:
        data["seed"] = seed
    data.setdefault("seed", 0)  # the file's seed when it names one
    config = get_config_class(algo_name)(**data)
    skip = config.env_preprocessing.frame_skip
    algo = config.build()
    sticky = config.env_preprocessing.repeat_action_probability
    out = {
        "algo": algo_name,
        "env": config.env,
        "repeat_action_probability": sticky,
        "budget_s": budget_s,
        "reached": False,
        "seconds_to_18": None,
        "agent_steps_to_18": None,
        "best_mean_20": None,
        "frames": 0,
        "agent_steps": 0,
        "frames_per_s": None,
        "learner_busy_fraction": None,
        "final_mean_20": None,
        "target": target,
        "seed": config.seed,
        "curve": [],
    }
    busy: list[float] = []  # Ape-X: the learner thread's busy share of each iteration once it trains
    try:
        while time.time() - spawn_time < budget_s:
            result = algo.train()
            games = list(algo.episodes.returns)[-WINDOW:]
            mean20 = float(np.mean(games)) if len(games) == WINDOW else None
            seconds = time.time() - spawn_time
            out["agent_steps"] = int(result["env_steps_sampled"])
            out["frames"] = out["agent_steps"] * skip
            out["frames_per_s"] = out["frames"] / seconds
            out["curve"].append([round(seconds, 1), out["frames"], mean20])
            if "learner_busy_fraction" in result and result.get("env_steps_trained", 0) > 0:
                busy.append(float(result["learner_busy_fraction"]))
                out["learner_busy_fraction"] = float(np.mean(busy))
            if mean20 is not None:
                out["final_mean_20"] = mean20
                out["best_mean_20"] = mean20 if out["best_mean_20"] is None else max(out["best_mean_20"], mean20)
            lr, entropy = result.get("learner/lr"), result.get("learner/entropy")
            log(
                f"{seconds:.0f} s, {out['frames']} frames ({out['frames_per_s']:.0f}/s), "
                f"{result['episodes_total']} games, mean of last {WINDOW}: {mean20}"
                + (f", learner busy {busy[-1]:.2f}" if busy else "")
                + (f", lr {lr:.3g}" if lr is not None else "")
                + (f", entropy {entropy:.3f}" if entropy is not None else "")
            )
            if mean20 is not None and target is not None and mean20 >= target:
                out.update(reached=True, seconds_to_18=seconds, agent_steps_to_18=out["agent_steps"])
                break
    finally:
        algo.stop()
        runtime.shutdown()
    return out


def draw_curve(out: dict, path: Path) -> None:
    """The mean of the last 20 games against frames (left) and against minutes (right), target dashed."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    points = [(s, f, m) for s, f, m in out.get("curve", []) if m is not None]
    target = out.get("target")
    pong = all(-21 <= m <= 21 for _, _, m in points)
    fig = Figure(figsize=(10, 3.6), dpi=110)
    for ax, x, label in (
        (fig.add_subplot(1, 2, 1), [f / 1e6 for _, f, _ in points], "emulator frames (millions)"),
        (fig.add_subplot(1, 2, 2), [s / 60 for s, _, _ in points], "minutes from process start"),
    ):
        ax.plot(x, [m for _, _, m in points], color="tab:blue")
        if target is not None:
            ax.axhline(target, color="grey", linestyle="--", linewidth=1)
        if pong:
            ax.set_ylim(-21.5, 21.5)
        ax.set_xlabel(label)
        ax.set_ylabel("mean of the last 20 games")
        ax.grid(alpha=0.3)
    sticky = out.get("repeat_action_probability")
    if target is None:
        outcome = f": {out.get('final_mean_20')} at the end, best {out.get('best_mean_20')}"
    elif out.get("reached"):
        outcome = f": {target:+g} at {out['agent_steps_to_18']:,} agent steps, {out['seconds_to_18'] / 60:.1f} min"
    else:
        outcome = f": {target:+g} not reached"
    fig.suptitle(
        f"{out.get('algo')} on {out.get('env')} (sticky actions {sticky if sticky is not None else 'as the id'})"
        + outcome
    )
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    p = argparse.ArgumentParser(description="Seconds until Pong's mean of the last 20 games reaches +18.")
    p.add_argument("--budget-s", type=float, default=3600.0)
    p.add_argument("--algo", default="appo")
    p.add_argument("--config", default=None, help="default: examples/<algo>_pong.yaml")
    p.add_argument(
        "--out-dir",
        default=str(REPO / "benchmarks" / "results"),
        help="where atari_pong_<algo>.json and .png (the learning curve) are written",
    )
    p.add_argument("--target", type=float, default=TARGET, help="stop when the mean of the last 20 games reaches it")
    p.add_argument("--no-target", action="store_true", help="train the whole budget (e.g. Breakout)")
    p.add_argument("--seed", type=int, default=None, help="replaces the config's seed (default: the config's, else 0)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--spawn-time", type=float, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    config = Path(args.config or REPO / "examples" / f"{args.algo}_pong.yaml")
    config = config if config.is_absolute() else (REPO / config).resolve()
    if not config.is_file():
        raise SystemExit(f"config file {config} does not exist")
    target = None if args.no_target else args.target
    if args.child:
        print(
            json.dumps(child(args.algo, str(config), args.budget_s, args.spawn_time or time.time(), target, args.seed)),
            flush=True,
        )
        return
    log(f"{args.algo} from {config}, budget {args.budget_s:.0f} s, target {target}, fresh process")
    r = run_child(
        __file__,
        [
            "--child",
            "--algo",
            args.algo,
            "--config",
            str(config),
            "--budget-s",
            str(args.budget_s),
            *(["--no-target"] if target is None else ["--target", str(target)]),
            *([] if args.seed is None else ["--seed", str(args.seed)]),
        ],
        args.budget_s + 600,
    )
    out = {"benchmark": "atari_pong", **r}
    out.setdefault("algo", args.algo)
    out.setdefault("budget_s", args.budget_s)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    default = args.config is None or config.stem == f"{args.algo}_pong"
    stem = f"atari_pong_{args.algo}" if default else f"atari_{config.stem}"
    stem += "" if args.seed is None else f"_seed{args.seed}"
    png = out_dir / f"{stem}.png"
    draw_curve(out, png)
    out["png"] = str(png)
    (out_dir / f"{stem}.json").write_text(json.dumps(out) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
