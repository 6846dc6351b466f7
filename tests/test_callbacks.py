"""shoal.Callbacks: the driver hooks' order and arguments, custom episode metrics gathered on the
runners (in-process and on Ray rollout actors) and aggregated per iteration, the config key by
class or import path (Python, YAML through the CLI) and its errors."""

from __future__ import annotations

import json
import math
import warnings

import hook_helpers
import numpy as np
import pytest
from helpers import invoke

import shoal
from shoal.callbacks import aggregate_custom
from shoal.errors import ConfigError
from shoal.rollout.env_runner import EnvRunner, env_info_at

SMALL = dict(
    env="CartPole-v1",
    seed=0,
    train_batch_size=256,
    minibatch_size=128,
    num_sgd_iter=1,
    resources={"num_envs_per_worker": 4},
)


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]


def test_aggregate_custom_by_hand():
    out = aggregate_custom([{"a": 1.0}, {"a": 3.0, "b": 2.0}, {"a": math.nan}, {}])
    assert out == {
        "custom/a_mean": 2.0,
        "custom/a_min": 1.0,
        "custom/a_max": 3.0,
        "custom/b_mean": 2.0,
        "custom/b_min": 2.0,
        "custom/b_max": 2.0,
    }
    assert aggregate_custom([]) == {}


def test_env_info_at_applies_the_vector_masks():
    info = {"x": np.array([1, 2]), "_x": np.array([False, True]), "episode": {"r": np.array([3.0, 4.0])}, "k": "v"}
    assert env_info_at(info, 0) == {"episode": {"r": 3.0}, "k": "v"}
    assert env_info_at(info, 1) == {"x": 2, "episode": {"r": 4.0}, "k": "v"}


def test_driver_hooks_run_in_order_with_their_arguments(tmp_path):
    hook_helpers.EVENTS.clear()
    config = shoal.PPOConfig(
        **SMALL, callbacks=hook_helpers.Recorder, evaluation={"evaluation_interval": 2, "evaluation_num_episodes": 2}
    )
    summary = shoal.train(config, {"iterations": 2}, out=tmp_path, checkpoint_every=1, progress=False)
    ev = hook_helpers.EVENTS
    # iteration 1: result, its numbered checkpoint, then best (the first finite return is the best)
    assert ev[:3] == [("train_result", 1, 1), ("checkpoint", "numbered", 1, True), ("checkpoint", "best", 1, True)]
    # iteration 2: evaluation inside train(), the result, the final checkpoint (best again only if it improved)
    assert ev[3:6] == [("evaluate", 2, 2), ("train_result", 2, 2), ("checkpoint", "final", 2, True)]
    assert ev[6:] in ([], [("checkpoint", "best", 2, True)])
    written = rows(summary.run_dir)
    assert [r["custom_note"] for r in written] == [7.0, 7.0]  # added by on_train_result before it was logged
    assert written[1]["evaluation/seen_by_hook"] == 1.0  # added by on_evaluate, under evaluation/
    assert "callbacks: hook_helpers:Recorder" in (summary.run_dir / "config.yaml").read_text()


def test_custom_metrics_are_each_episodes_figures_aggregated_per_iteration():
    """In the first iteration fewer than 100 episodes end, so episode_len_mean covers the same episodes."""
    with shoal.PPOConfig(**SMALL, callbacks="hook_helpers:Recorder").build() as algo:
        r1 = algo.train()
        n1 = r1["episodes_total"]
        assert 0 < n1 < 100
        assert r1["custom/length_mean"] == pytest.approx(r1["episode_len_mean"])
        assert r1["custom/steps_mean"] == pytest.approx(r1["episode_len_mean"])  # on_episode_step ran every step
        assert r1["custom/return_mean"] == pytest.approx(r1["episode_return_mean"])  # CartPole: return = length
        assert (
            r1["custom/length_min"] == r1["episode_return_min"] and r1["custom/length_max"] == r1["episode_return_max"]
        )
        assert r1["custom/worker_max"] == 0.0  # the driver's own runner
        r2 = algo.train()
        window = list(algo.episodes.lengths)[n1:]  # this iteration's episodes only, not the 100-episode window
        assert r2["custom/length_mean"] == pytest.approx(np.mean(window))
        assert r2["custom/length_max"] == max(window)


def test_runner_hands_one_record_per_finished_episode():
    config = shoal.PPOConfig(**SMALL, callbacks="hook_helpers:EndOnly")
    from shoal.rollout.policies import ActorCriticPolicy

    runner = EnvRunner(config, 0, ActorCriticPolicy, rollout_fragment_length=100)
    assert runner._step_hook is False and runner._end_hook is True  # no per-step call without an override
    _, m = runner.sample()
    assert [c["length"] for c in m.custom_metrics] == m.episode_lengths and m.episode_lengths
    assert all(c["has_info"] == 1.0 for c in m.custom_metrics)
    runner.stop()


def test_without_episode_hooks_the_runner_does_no_episode_bookkeeping():
    from shoal.rollout.policies import ActorCriticPolicy

    for spec in (None, hook_helpers.DriverOnly):
        runner = EnvRunner(shoal.PPOConfig(**SMALL, callbacks=spec), 0, ActorCriticPolicy, rollout_fragment_length=50)
        assert runner._episodes is None
        _, m = runner.sample()
        assert m.custom_metrics == []
        runner.stop()


@pytest.mark.ray
def test_custom_metrics_come_back_from_ray_rollout_actors(ray_cluster):
    config = shoal.PPOConfig(
        **{**SMALL, "resources": {"num_workers": 2, "num_envs_per_worker": 2, "num_cpus_per_worker": 0.5}},
        callbacks="hook_helpers:Recorder",
    )
    with config.build() as algo:
        r = algo.train()
    assert 0 < r["episodes_total"] < 100
    assert r["custom/length_mean"] == pytest.approx(r["episode_len_mean"])
    assert r["custom/steps_mean"] == pytest.approx(r["episode_len_mean"])
    assert r["custom/worker_min"] >= 1.0 and r["custom/worker_max"] <= 2.0  # built inside the actors


def test_multi_agent_runner_reports_agent_returns():
    config = shoal.PPOConfig(
        env="shoal.envs.signal_match:parallel_env",
        seed=0,
        rollout_fragment_length=10,
        minibatch_size=120,
        resources={"num_envs_per_worker": 16},
        multi_agent={"policies": {"shared": None}},
        callbacks="hook_helpers:AgentReturns",
    )
    with config.build() as algo:
        for _ in range(3):
            r = algo.train()
            if "custom/agents_mean" in r:
                break
    assert r["custom/agents_mean"] == 3.0  # signal_match: three agents
    assert abs(r["custom/sum_gap_max"]) < 1e-6 and abs(r["custom/sum_gap_min"]) < 1e-6


@pytest.mark.parametrize(
    "spec, words",
    [
        ("hook_helpers:Missing", "cannot import 'hook_helpers:Missing'"),
        ("no_such_module_xyz:Hooks", "cannot import 'no_such_module_xyz:Hooks'"),
        ("hook_helpers:NotCallbacks", "is not a subclass of shoal.Callbacks"),
        ("hook_helpers:NeedsArgs", "must build with no arguments"),
        ("Recorder", "is not an import path"),
        (hook_helpers.NotCallbacks, "is not a subclass of shoal.Callbacks"),
    ],
)
def test_bad_callbacks_are_config_errors(spec, words):
    with pytest.raises(ConfigError, match="callbacks") as e:
        shoal.PPOConfig(env="CartPole-v1", callbacks=spec)
    assert words in str(e.value)


def test_a_class_is_stored_as_its_import_path_and_round_trips():
    config = shoal.PPOConfig(env="CartPole-v1", callbacks=hook_helpers.Recorder)
    assert config.to_dict()["callbacks"] == "hook_helpers:Recorder"
    again = shoal.PPOConfig.from_dict(config.to_dict())
    assert again.callbacks == "hook_helpers:Recorder"


def test_a_local_class_works_in_process_but_is_not_stored(tmp_path):
    class Local(shoal.Callbacks):
        def on_episode_end(self, episode):
            return {"one": 1.0}

    config = shoal.PPOConfig(**SMALL, callbacks=Local)
    assert config.to_dict()["callbacks"] is None
    with pytest.warns(UserWarning, match="record no callbacks"):
        summary = shoal.train(config, {"iterations": 1}, out=tmp_path, progress=False)
    assert summary.result["custom/one_mean"] == 1.0
    assert "callbacks: null" in (summary.run_dir / "config.yaml").read_text()


def test_cli_takes_the_import_path_from_a_yaml_file(tmp_path):
    cfg = tmp_path / "ppo.yaml"
    cfg.write_text(
        "algo: ppo\nenv: CartPole-v1\ntrain_batch_size: 256\nminibatch_size: 128\nnum_sgd_iter: 1\n"
        "resources: {num_envs_per_worker: 4}\ncallbacks: hook_helpers:Recorder\n"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = invoke("train", "ppo", "-c", str(cfg), "--stop-iters", "1", "--out", str(tmp_path / "runs"), "-q")
    assert r.exit_code == 0, r.output
    (run_dir,) = (tmp_path / "runs").iterdir()
    (row,) = rows(run_dir)
    assert row["custom/length_mean"] == pytest.approx(row["episode_len_mean"]) and row["custom_note"] == 7.0


def test_cli_bad_import_path_is_exit_2_with_one_paragraph(tmp_path):
    cfg = tmp_path / "ppo.yaml"
    cfg.write_text("algo: ppo\nenv: CartPole-v1\ncallbacks: hook_helpers:Nope\n")
    r = invoke("train", "ppo", "-c", str(cfg), "--stop-iters", "1", "--out", str(tmp_path / "runs"))
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert "Traceback" not in text and "callbacks" in text and "cannot import 'hook_helpers:Nope'" in text
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "algo, kw",
    [
        ("dqn", dict(learning_starts=100, train_batch_size=32, model={"hiddens": [16]})),
        (
            "apex",
            dict(
                learning_starts=100,
                train_batch_size=32,
                replay_capacity=1000,
                min_time_s_per_iteration=0,
                model={"hiddens": [16]},
            ),
        ),
        ("impala", dict(train_batch_size=100, min_time_s_per_iteration=0, model={"hiddens": [16]})),
        ("appo", dict(train_batch_size=100, min_time_s_per_iteration=0, model={"hiddens": [16]})),
    ],
)
def test_every_single_agent_algorithm_reports_custom_metrics(algo, kw):
    from shoal.algorithms import get_config_class

    config = get_config_class(algo)(
        env="CartPole-v1",
        seed=0,
        callbacks="hook_helpers:EndOnly",
        resources={"num_envs_per_worker": 4},
        min_env_steps_per_iteration=200,
        **kw,
    )
    with config.build() as a:
        for _ in range(6):  # until episodes end (Ape-X's low-epsilon actor keeps CartPole up longer)
            r = a.train()
            if r["episodes_total"]:
                break
        lengths = list(a.episodes.lengths)  # all ended in this iteration: the earlier ones had none
    assert 0 < len(lengths) < 100 and r["episodes_total"] == len(lengths)
    assert r["custom/length_mean"] == pytest.approx(np.mean(lengths))  # the same episodes as the return window
    assert r["custom/length_min"] == min(lengths) and r["custom/has_info_mean"] == 1.0


def test_ddppo_workers_gather_custom_metrics():
    from shoal.algorithms.ddppo import DDPPOConfig, DDPPOWorker

    cfg = DDPPOConfig(
        env="CartPole-v1",
        rollout_fragment_length=32,
        minibatch_size=64,
        num_sgd_iter=1,
        seed=0,
        resources={"num_workers": 1, "num_envs_per_worker": 4},
        callbacks="hook_helpers:EndOnly",
    )
    worker = DDPPOWorker(cfg, 1)
    try:
        r = worker.sample_and_train()
        assert r.metrics.episode_lengths
        assert [c["length"] for c in r.metrics.custom_metrics] == r.metrics.episode_lengths
    finally:
        worker.stop()


def test_the_league_reports_custom_metrics_and_its_keys_reach_on_train_result():
    from shoal.algorithms.alpha_star import AlphaStarConfig

    league = {"type": "alpha_star", "seed": 0, "min_games_for_snapshot": 5, "win_rate_window": 20}
    config = AlphaStarConfig(
        env="pettingzoo.classic:tictactoe_v3",
        seed=0,
        rollout_fragment_length=8,
        train_batch_size=128,
        min_time_s_per_iteration=0.0,
        min_env_steps_per_iteration=300,
        league=league,
        model={"hiddens": [32]},
        resources={"num_envs_per_worker": 8},
        callbacks="hook_helpers:AgentReturns",
    )
    with config.build() as algo:
        r = algo.train()
    assert r["custom/agents_mean"] == 2.0 and abs(r["custom/sum_gap_max"]) < 1e-6
    assert r["saw_num_policies"] == 1.0
