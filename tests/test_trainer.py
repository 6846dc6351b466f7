"""The training loop (shoal.app.trainer): the best checkpoint by the algorithm's own metric, and resume."""

from __future__ import annotations

import io
import json
import math

import pytest
from helpers import invoke
from rich.console import Console

from shoal import train
from shoal.algorithms import REGISTRY
from shoal.algorithms.ppo import PPO, PPOConfig
from shoal.app.trainer import Stop
from shoal.logging.progress import ProgressDisplay

SMALL = dict(train_batch_size=256, minibatch_size=128, num_sgd_iter=1, resources={"num_envs_per_worker": 2})
SCORES = {1: math.nan, 2: 5.0, 3: 3.0}  # iteration 4 reports no score at all


class ScoredPPOConfig(PPOConfig):
    algo = "scored_ppo"


class ScoredPPO(PPO):
    """PPO whose best checkpoint is picked by a made-up ``fake/score``, not by the mean return."""

    config_cls = ScoredPPOConfig
    best_metric = "fake/score"

    def train(self):
        result = super().train()
        if self.iteration in SCORES:
            result["fake/score"] = SCORES[self.iteration]
        return result


class LowScoredPPO(ScoredPPO):
    best_metric_mode = "min"


@pytest.fixture
def scored_ppo(monkeypatch):
    """Registers ``scored_ppo`` so that ``config.build()`` and the CLI find ScoredPPO (or the class given)."""

    def register(cls):
        monkeypatch.setitem(
            REGISTRY, "scored_ppo", (__name__, cls.__name__, "ScoredPPOConfig", "PPO with a fake score.")
        )
        monkeypatch.setattr(ScoredPPOConfig, "algorithm_cls", cls)  # LowScoredPPO inherits config_cls: not registered

    register(ScoredPPO)
    return register


@pytest.mark.parametrize("cls, best_iter, best_value", [(ScoredPPO, 2, 5.0), (LowScoredPPO, 3, 3.0)])
def test_best_checkpoint_follows_the_algorithms_best_metric(scored_ppo, tmp_path, cls, best_iter, best_value):
    scored_ppo(cls)
    cfg = ScoredPPOConfig(env="CartPole-v1", seed=0, **SMALL)
    summary = train(cfg, {"iterations": 4}, out=tmp_path, checkpoint_every=2, progress=False)
    assert summary.best_metric == "fake/score" and summary.best_value == best_value
    meta = json.loads((summary.best_checkpoint / "meta.json").read_text())
    assert meta["iteration"] == best_iter  # NaN (iteration 1) and missing (4) never win
    assert meta["best_metric"] == "fake/score" and meta["best_value"] == best_value
    returns = [r["episode_return_mean"] for r in summary.results]
    assert summary.best_return == max(r for r in returns if math.isfinite(r))  # the return is still tracked


def test_cli_summary_names_the_best_metric(scored_ppo, tmp_path):
    r = invoke(
        "train",
        "scored_ppo",
        "--env",
        "CartPole-v1",
        "--stop-iters",
        "3",
        "--out",
        str(tmp_path),
        "-q",
        "--seed",
        "0",
        "--envs-per-worker",
        "2",
        "--set",
        "train_batch_size=256",
        "--set",
        "minibatch_size=128",
        "--set",
        "num_sgd_iter=1",
    )
    assert r.exit_code == 0, r.output
    assert "Best fake/score 5." in " ".join(r.output.split())


def test_an_unknown_best_metric_mode_is_a_clear_error(scored_ppo, tmp_path, monkeypatch):
    from shoal.errors import ConfigError

    monkeypatch.setattr(ScoredPPO, "best_metric_mode", "highest")
    with pytest.raises(ConfigError, match="best_metric_mode is 'highest'; it must be 'max' or 'min'"):
        train(ScoredPPOConfig(env="CartPole-v1", **SMALL), {"iterations": 1}, out=None, progress=False)


@pytest.mark.parametrize("terminal", [False, True])
def test_progress_display_shows_the_best_metric(terminal):
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=terminal, width=200)
    result = {"iteration": 3, "env_steps_sampled": 300, "episode_return_mean": 0.01, "time_total_s": 2.0}
    with ProgressDisplay("league", Stop(iterations=9), console=console, best_metric="league/win_rate/main") as d:
        d.update(result, 2.5, best=0.8125)
        assert "best win rate/main 0.8125" in d.plain_line(result, best=0.8125)
    assert "best win rate/main 0.8125" in buf.getvalue()


@pytest.fixture
def two_iteration_run(tmp_path):
    cfg = PPOConfig(env="CartPole-v1", seed=0, **SMALL)
    summary = train(cfg, {"iterations": 2}, out=tmp_path / "runs", checkpoint_every=1, progress=False)
    return summary.run_dir


def forbid_building(monkeypatch):
    """Any attempt to restore (build) the algorithm fails the test: an already-met run starts nothing."""
    from shoal.framework.base import Algorithm

    def fail(*a, **k):
        raise AssertionError("resume built the algorithm although its stop criterion was already met")

    monkeypatch.setattr(Algorithm, "from_checkpoint", fail)


def rows(run_dir):
    return [json.loads(line)["iteration"] for line in (run_dir / "results.jsonl").read_text().splitlines()]


def test_resume_with_a_criterion_already_met_trains_nothing(two_iteration_run, monkeypatch):
    from shoal.app.trainer import resume

    run_dir = two_iteration_run
    forbid_building(monkeypatch)
    s = resume(run_dir, progress=False)  # run.yaml still says: stop after 2 iterations
    assert s.already_met and s.stop_reason == "iterations" and s.results == []
    assert s.stop_detail == "iterations 2 >= 2"
    assert s.last_checkpoint.name == "checkpoint_000002"
    s = resume(run_dir, stop={"iterations": 5, "reward": 5}, progress=False)  # CartPole returns are above 5 at once
    assert s.already_met and s.stop_reason == "reward" and s.solved
    assert s.stop_detail.startswith("mean return ") and s.stop_detail.endswith(" >= 5")
    assert float(s.stop_detail.split()[2]) == pytest.approx(s.result["episode_return_mean"], abs=0.05)
    assert rows(run_dir) == [1, 2] and len(list((run_dir / "checkpoints").glob("checkpoint_*"))) == 2


def test_resume_reads_older_checkpoints_without_the_figures_in_meta(two_iteration_run, monkeypatch):
    from shoal.app.trainer import resume

    meta_file = two_iteration_run / "checkpoints" / "checkpoint_000002" / "meta.json"
    meta = json.loads(meta_file.read_text())
    meta_file.write_text(
        json.dumps({k: v for k, v in meta.items() if k not in ("time_total_s", "episode_return_mean")})
    )
    forbid_building(monkeypatch)
    s = resume(two_iteration_run, stop={"time_s": meta["time_total_s"] / 2}, progress=False)
    assert s.already_met and s.stop_reason == "time" and s.stop_detail.startswith("training time ")


def test_resume_cli_says_which_criterion_is_met(two_iteration_run, monkeypatch):
    forbid_building(monkeypatch)
    r = invoke("resume", str(two_iteration_run), "-q")
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "already meets its stop criterion iterations 2 >= 2" in text and "--stop-iters" in text
    assert rows(two_iteration_run) == [1, 2]


def test_best_metric_takes_numpy_scalars_and_ignores_what_is_not_a_number():
    import numpy as np

    from shoal.app.run_session import BestMetric

    best = BestMetric(ScoredPPO.__new__(ScoredPPO))  # only the class attributes are read
    offers = [
        {"fake/score": math.nan},
        {"fake/score": np.float32(2.5)},
        {"fake/score": True},
        {"fake/score": "9"},
        {},
        {"fake/score": np.int64(2)},
        {"fake/score": 3},
    ]
    assert [best.offer(r) for r in offers] == [False, True, False, False, False, False, True]
    assert best.value == 3.0
