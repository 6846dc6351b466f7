"""`shoal evaluate`: which checkpoint, --json, --stochastic, --video, games against opponents, errors."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest
from helpers import flat, invoke

import shoal
from shoal import PPOConfig
from shoal.app.evaluation import select_checkpoint

CATCH = "shoal.envs.pixel_catch:PixelCatch"
SMALL_CNN = {"torso": "conv", "conv_filters": [[8, 3, 2]], "hiddens": [32], "activation": "relu"}
TTT = "pettingzoo.classic:tictactoe_v3"


def evaluate_json(*args) -> dict:
    r = invoke("evaluate", *args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)  # the whole of stdout is one JSON object


def untrained(tmp_path, name: str, **config) -> str:
    """A checkpoint of a freshly built (untrained) algorithm: a near-uniform policy."""
    algo = PPOConfig(seed=0, **config).build()
    try:
        return str(algo.save(tmp_path / name))
    finally:
        algo.stop()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    cfg = PPOConfig(env="CartPole-v1", seed=0, train_batch_size=256, minibatch_size=128, num_sgd_iter=2)
    summary = shoal.train(cfg, {"iterations": 3}, out=out, checkpoint_every=1, keep_checkpoints=3, progress=False)
    return summary.run_dir


@pytest.fixture(scope="module")
def game_checkpoint(tmp_path_factory):
    """Multi-agent PPO on tic-tac-toe after one iteration; its one policy is 'main'."""
    cfg = PPOConfig(
        env=TTT,
        seed=0,
        train_batch_size=256,
        minibatch_size=128,
        num_sgd_iter=1,
        rollout_fragment_length=32,
        resources={"num_envs_per_worker": 8},
        multi_agent={"policies": {"main": None}},
    )
    algo = cfg.build()
    try:
        algo.train()
        return str(algo.save(tmp_path_factory.mktemp("game") / "ttt"))
    finally:
        algo.stop()


# ---- which checkpoint ----------------------------------------------------------------------------
def test_evaluate_resolves_the_run_dir_once_and_reads_meta_and_state_once(tmp_path, monkeypatch):
    """`shoal evaluate RUN_DIR` opens the checkpoint once (shoal.checkpoint.open_checkpoint): one
    resolution of the run directory, one parse of meta.json, one torch.load of state.pt."""
    from pathlib import Path

    import torch

    from shoal import checkpoint as ckpt

    run = tmp_path / "run"
    best = run / "checkpoints" / "best"
    untrained(run / "checkpoints", "checkpoint_000001", env="CartPole-v1")
    shutil.copytree(run / "checkpoints" / "checkpoint_000001", best)
    calls = {"resolve_checkpoint": 0, "meta.json": 0, "state.pt": 0}
    real_resolve, real_read, real_load = ckpt.resolve_checkpoint, Path.read_text, torch.load

    def resolve(*a, **k):
        calls["resolve_checkpoint"] += 1
        return real_resolve(*a, **k)

    def read_text(self, *a, **k):
        calls["meta.json"] += self.name == ckpt.META_FILE
        return real_read(self, *a, **k)

    def load(f, *a, **k):
        calls["state.pt"] += Path(getattr(f, "name", f)).name == ckpt.STATE_FILE
        return real_load(f, *a, **k)

    monkeypatch.setattr(ckpt, "resolve_checkpoint", resolve)
    monkeypatch.setattr(Path, "read_text", read_text)
    monkeypatch.setattr(torch, "load", load)
    assert evaluate_json(run, "-n", 1, "--seed", 0)["checkpoint"] == str(best)
    assert calls == {"resolve_checkpoint": 1, "meta.json": 1, "state.pt": 1}


def test_checkpoint_best_and_last_pick_the_run_s_directories(run_dir):
    ckpts = run_dir / "checkpoints"
    assert select_checkpoint(run_dir, "last") == ckpts / "checkpoint_000003"
    assert select_checkpoint(run_dir, "best") == ckpts / "best"
    assert select_checkpoint(run_dir, "checkpoint_000001") == ckpts / "checkpoint_000001"
    assert select_checkpoint(run_dir) == ckpts / "best"  # the default for a run directory
    # best holds the iteration whose mean return was highest
    rows = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    best_iter = max(rows, key=lambda r: r["episode_return_mean"])["iteration"]
    assert json.loads((ckpts / "best" / "meta.json").read_text())["iteration"] == best_iter
    assert evaluate_json(run_dir, "-n", 1, "--checkpoint", "last")["checkpoint"] == str(ckpts / "checkpoint_000003")
    assert evaluate_json(run_dir, "-n", 1, "--checkpoint", "best")["checkpoint"] == str(ckpts / "best")


def test_last_skips_an_incomplete_checkpoint_and_a_missing_choice_lists_what_exists(run_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    half = run / "checkpoints" / "checkpoint_000009"  # meta.json but no state.pt: an interrupted copy
    half.mkdir()
    shutil.copy(run / "checkpoints" / "best" / "meta.json", half / "meta.json")
    assert select_checkpoint(run, "last") == run / "checkpoints" / "checkpoint_000003"
    shutil.rmtree(run / "checkpoints" / "best")
    r = invoke("evaluate", run, "--checkpoint", "best")
    assert r.exit_code == 2
    text = flat(r.output)
    assert "no checkpoints/best" in text and "checkpoint_000001, checkpoint_000002, checkpoint_000003" in text
    r = invoke("evaluate", run, "--checkpoint", "checkpoint_000042")
    assert r.exit_code == 2 and "checkpoint_000042" in flat(r.output) and "checkpoint_000003" in flat(r.output)


def test_missing_path_and_best_of_a_checkpoint_exit_2(run_dir, tmp_path):
    r = invoke("evaluate", tmp_path / "nope")
    assert r.exit_code == 2 and "does not exist" in flat(r.output) and "Traceback" not in r.output
    r = invoke("evaluate", run_dir / "checkpoints" / "best", "--checkpoint", "last")
    assert r.exit_code == 2 and "is a checkpoint itself" in flat(r.output)


# ---- --json and --stochastic ----------------------------------------------------------------------
def test_json_holds_the_figures_of_its_per_episode_returns(run_dir):
    rep = evaluate_json(run_dir, "-n", 4, "--seed", 3)
    assert rep["algo"] == "ppo" and rep["env"] == "CartPole-v1" and rep["episodes"] == 4 and rep["deterministic"]
    returns = rep["returns"]
    assert len(returns) == 4
    assert rep["return_mean"] == pytest.approx(np.mean(returns))
    assert rep["return_std"] == pytest.approx(np.std(returns))
    assert (rep["return_min"], rep["return_max"]) == (min(returns), max(returns))
    assert rep["length_mean"] == pytest.approx(np.mean(returns))  # CartPole: +1 per step
    assert "wins" not in rep


def test_greedy_repeats_with_a_seed_and_stochastic_differs_on_an_untrained_policy(tmp_path):
    path = untrained(tmp_path, "fresh", env="CartPole-v1")
    greedy = [evaluate_json(path, "-n", 6, "--seed", 5)["returns"] for _ in range(2)]
    assert greedy[0] == greedy[1]
    sampled = evaluate_json(path, "-n", 6, "--seed", 5, "--stochastic")
    assert not sampled["deterministic"] and sampled["returns"] != greedy[0]
    assert evaluate_json(path, "-n", 6, "--seed", 5, "--stochastic")["returns"] == sampled["returns"]  # seeded sampling
    r = invoke("evaluate", path, "-n", 2, "--stochastic")
    assert r.exit_code == 0 and "over 2 stochastic episodes" in flat(r.output)


def test_stochastic_dqn_uses_the_checkpoint_s_epsilon(tmp_path):
    from shoal import DQNConfig

    algo = DQNConfig(env="CartPole-v1", seed=0).build()  # epsilon 1.0 at step 0: every action random
    path = str(algo.save(tmp_path / "dqn"))
    algo.stop()
    greedy = evaluate_json(path, "-n", 5, "--seed", 1)
    sampled = evaluate_json(path, "-n", 5, "--seed", 1, "--stochastic")
    assert greedy["returns"] != sampled["returns"]


def test_stochastic_is_refused_for_ape_x_whose_policy_has_no_epsilon(tmp_path):
    from shoal import ApeXConfig

    algo = ApeXConfig(env="CartPole-v1", seed=0, replay_capacity=1000, learning_starts=100).build()
    path = str(algo.save(tmp_path / "apex"))
    algo.stop()
    r = invoke("evaluate", path, "-n", 1, "--stochastic")
    assert r.exit_code == 2 and "leave --stochastic out" in flat(r.output)
    assert evaluate_json(path, "-n", 1)["deterministic"]


# ---- --video -----------------------------------------------------------------------------------
def test_video_writes_the_first_k_episodes_as_an_mp4(tmp_path):
    import imageio.v2 as imageio

    path = untrained(tmp_path, "catch", env=CATCH, model=SMALL_CNN)
    video = tmp_path / "out" / "catch.mp4"
    rep = evaluate_json(path, "-n", 3, "--video", video, "--video-episodes", 2)
    assert rep["episodes"] == 3 and video.stat().st_size > 0
    with imageio.get_reader(video) as reader:
        frames = [f for f in reader]  # not list(reader): its length is inf for ffmpeg
    # PixelCatch episodes are 9 steps: per recorded episode the reset frame and one per step
    assert rep["length_mean"] == 9 and len(frames) == 2 * (9 + 1)
    assert frames[0].shape == (80, 80, 3)  # the 10x10 screen at 8x8 per pixel, RGB


def test_video_frames_stream_to_the_file_and_stop_at_the_length_cap(tmp_path):
    import tracemalloc

    import imageio.v2 as imageio

    from shoal.app.evaluation import VideoWriter, load_for_evaluation, play_episodes

    path = untrained(tmp_path, "catch", env=CATCH, model=SMALL_CNN)
    algo = load_for_evaluation(path)
    peaks = {}
    try:
        for episodes in (20, 200):  # 210 and 2,100 frames of 80x80x3 (19 KB each: 40 MB if all were kept)
            tracemalloc.start()
            with VideoWriter(tmp_path / f"v{episodes}.mp4") as writer:
                play_episodes(algo, episodes, record=episodes, video=writer)
            peaks[episodes] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert writer.count == episodes * 10
    finally:
        algo.stop()
    assert peaks[200] < peaks[20] + 4_000_000, peaks  # memory does not grow with the length
    r = invoke("evaluate", path, "-n", 3, "--video", tmp_path / "cut.mp4", "--video-length", 15)
    assert r.exit_code == 0, r.output
    with imageio.get_reader(tmp_path / "cut.mp4") as reader:
        assert sum(1 for _ in reader) == 15
    text = flat(r.output)
    assert "15 frames" in text and "cut at --video-length 15" in text and "episode 3/3" in text


def test_recording_a_video_prints_nothing_about_a_display(tmp_path):
    import os
    import subprocess

    path = untrained(tmp_path, "cart", env="CartPole-v1")
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "SDL_VIDEODRIVER", "DISPLAY")}
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "shoal",
            "evaluate",
            path,
            "-n",
            "1",
            "--video",
            str(tmp_path / "c.mp4"),
            "--video-length",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    assert "XDG_RUNTIME_DIR" not in p.stderr + p.stdout and "5 frames" in p.stdout, p.stderr


def test_video_errors_name_the_cause(tmp_path, monkeypatch):
    path = untrained(tmp_path, "cue", env="shoal.envs.memory:RememberCue")
    r = invoke("evaluate", path, "-n", 1, "--video", tmp_path / "x.mp4")
    assert r.exit_code == 2 and "Cannot record a video" in flat(r.output) and "rgb_array" in flat(r.output)
    cart = untrained(tmp_path, "cart", env="CartPole-v1")
    monkeypatch.setitem(sys.modules, "imageio", None)
    monkeypatch.setitem(sys.modules, "imageio.v2", None)
    r = invoke("evaluate", cart, "-n", 1, "--video", tmp_path / "x.mp4")
    assert r.exit_code == 2 and "pip install -e '.[video]' in the shoal checkout" in flat(r.output)
    r = invoke("evaluate", cart, "--video-episodes", 1)
    assert r.exit_code == 2 and "--video" in flat(r.output)


# ---- games -------------------------------------------------------------------------------------
@pytest.mark.parametrize("opponent", ["random", "heuristic"])
def test_games_against_scripted_opponents_count_every_game(game_checkpoint, opponent):
    rep = evaluate_json(game_checkpoint, "-n", 12, "--opponent", opponent)
    assert rep["player"] == "main" and rep["opponent"] == opponent
    assert rep["wins"] + rep["draws"] + rep["losses"] == 12 == rep["episodes"] == len(rep["returns"])
    assert rep["win_rate"] == pytest.approx(rep["wins"] / 12) and rep["loss_rate"] == pytest.approx(rep["losses"] / 12)
    # tic-tac-toe pays +1 / 0 / -1 to the evaluated player
    assert sorted(rep["returns"]) == [-1.0] * rep["losses"] + [0.0] * rep["draws"] + [1.0] * rep["wins"]


def test_games_against_another_checkpoint_and_as_text(game_checkpoint, tmp_path):
    other = untrained(tmp_path, "other", env=TTT, multi_agent={"policies": {"main": None}})
    rep = evaluate_json(game_checkpoint, "-n", 10, "--opponent", other)
    assert rep["wins"] + rep["draws"] + rep["losses"] == 10 and rep["opponent"] == "main"
    r = invoke("evaluate", game_checkpoint, "-n", 6, "--opponent", "random", "--stochastic")
    text = flat(r.output)
    assert r.exit_code == 0 and "main vs random over 6 stochastic games" in text and "wins" in text
    assert "main vs random over 4 greedy games" in flat(invoke("evaluate", game_checkpoint, "-n", 4).output)


def test_opponent_errors_exit_2(game_checkpoint, run_dir, tmp_path):
    r = invoke("evaluate", run_dir, "--opponent", "random")
    assert r.exit_code == 2 and "single-agent env" in flat(r.output)
    r = invoke("evaluate", game_checkpoint, "--opponent", "grandmaster")
    assert r.exit_code == 2 and "random, heuristic, heuristic2 or a checkpoint path" in flat(r.output)
    r = invoke("evaluate", game_checkpoint, "--video", tmp_path / "g.mp4")
    assert r.exit_code == 2 and "single-agent" in flat(r.output)
    rps = untrained(tmp_path, "rps", env="pettingzoo.classic:rps_v2", multi_agent={"policies": {"main": None}})
    r = invoke("evaluate", rps, "-n", 2, "--opponent", "heuristic")
    assert r.exit_code == 2 and "connect four" in flat(r.output) and "tic-tac-toe" in flat(r.output)
    assert evaluate_json(rps, "-n", 4, "--opponent", "random")["wins"] >= 0  # random plays any two-player game


def test_a_league_checkpoint_plays_its_main_policy(game_checkpoint, tmp_path):
    from shoal import AlphaStarConfig

    algo = AlphaStarConfig(
        env=TTT,
        seed=0,
        rollout_fragment_length=8,
        train_batch_size=64,
        min_time_s_per_iteration=0.0,
        resources={"num_envs_per_worker": 4},
    ).build()
    try:
        algo.train()
        league = str(algo.save(tmp_path / "league"))
    finally:
        algo.stop()
    rep = evaluate_json(league, "-n", 8, "--opponent", "heuristic")
    assert rep["algo"] == "alpha_star" and rep["player"] == "main" and rep["opponent"] == "heuristic"
    assert rep["wins"] + rep["draws"] + rep["losses"] == 8
    # against a multi-agent PPO checkpoint's main policy; both greedy, so each seat repeats one game
    rep = evaluate_json(league, "-n", 8, "--opponent", game_checkpoint)
    assert rep["wins"] + rep["draws"] + rep["losses"] == 8
    assert rep["win_rate_first"] in (0.0, 1.0) and rep["win_rate_second"] in (0.0, 1.0)


def test_a_multi_agent_env_of_three_agents_plays_its_policies_together(tmp_path):
    path = untrained(
        tmp_path,
        "signals",
        env="shoal.envs.signal_match:parallel_env",
        env_config={"episode_len": 4},
        multi_agent={"policies": {"shared": None}},
    )
    rep = evaluate_json(path, "-n", 5)
    # SignalMatch pays each of its 3 agents at most 1 per step: a 4-step episode sums to at most 12
    assert rep["episodes"] == 5 == len(rep["returns"]) and rep["length_mean"] == 4 and "wins" not in rep
    assert all(0 <= x <= 12 for x in rep["returns"]) and rep["return_mean"] == pytest.approx(np.mean(rep["returns"]))
    r = invoke("evaluate", path, "--opponent", "random")
    assert r.exit_code == 2 and "two-player games" in flat(r.output) and "3 agents" in flat(r.output)
