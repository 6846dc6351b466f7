"""A hung env: the request times out, its actor is recreated, and the run goes on."""

from __future__ import annotations

import logging
import os
import re

import pytest
from test_sigkill import train_until

from shoal import PPOConfig
from shoal.errors import EnvError

pytestmark = pytest.mark.ray
HANG = "flaky_envs:HangingCartPole"
SMALL = dict(train_batch_size=256, minibatch_size=128, num_sgd_iter=1, rollout_fragment_length=32)


def _res(**kw):
    return {"num_workers": 2, "num_envs_per_worker": 4, "num_cpus_per_worker": 0.5, "request_timeout_s": 3, **kw}


@pytest.mark.parametrize("algo_name", ["ppo", "impala"])  # a synchronous foreach, an asynchronous pipeline
def test_hung_env_times_out_and_the_actor_is_recreated(ray_cluster, tmp_path, caplog, algo_name):
    from shoal.algorithms import get_config_class

    extra = SMALL if algo_name == "ppo" else dict(train_batch_size=256, rollout_fragment_length=32)
    cfg = get_config_class(algo_name)(
        env=HANG, env_config={"hang_at": 10, "marker": str(tmp_path / "hung")}, seed=0, resources=_res(), **extra
    )
    algo = cfg.build()
    try:
        with caplog.at_level(logging.WARNING, logger="shoal.runtime"):
            r = train_until(algo, lambda x: x["num_worker_timeouts"] >= 1)
        assert (tmp_path / "hung").exists()  # one env did hang
        trained = r["env_steps_trained"]
        last = train_until(algo, lambda x: x["env_steps_trained"] > trained and x["iteration"] >= r["iteration"] + 2)
        assert last["num_worker_timeouts"] == 1
        assert last["num_worker_restarts"] == 1
        assert last["env_steps_trained"] > trained  # training went on
        line = next(r.getMessage() for r in caplog.records if "has not returned" in r.getMessage())
        assert (
            "rollout actor" in line
            and "sample()" in line
            and "HangingCartPole" in line
            and "request_timeout_s=3" in line
        )
        # The replacement samples: both actors answer again.
        assert len(algo.env_runners.foreach("get_weights")) == 2
    finally:
        algo.stop()


def test_stop_time_fires_while_the_driver_waits_on_a_hung_actor(ray_cluster, tmp_path):
    from shoal.app.trainer import train

    # The request timeout is far off: only the run's deadline can end the wait. The hang comes in
    # the second iteration (32 steps per env and iteration), so the first one is checkpointed.
    cfg = PPOConfig(
        env=HANG,
        env_config={"hang_at": 40, "marker": str(tmp_path / "hung")},
        seed=0,
        resources=_res(request_timeout_s=3600),
        **SMALL,
    )
    algo = cfg.build()
    try:
        algo.start_actors()
        algo.env_runners.foreach("get_weights")  # the actors are up: the 8 s go to sampling
        summary = train(cfg, stop={"time_s": 8}, out=str(tmp_path / "runs"), progress=False, _algo=algo)
    finally:
        algo.stop()
    assert (tmp_path / "hung").exists()
    assert summary.stop_reason == "time"
    assert summary.result["time_total_s"] >= 8 and summary.result["iteration"] == 1
    assert summary.result.get("num_worker_timeouts", 0) == 0  # the deadline ended the wait, not the timeout
    assert summary.last_checkpoint is not None and summary.last_checkpoint.is_dir()


def test_ddppo_hung_worker_times_out_the_round_and_the_group_reforms(ray_cluster, tmp_path):
    from shoal.algorithms.ddppo import DDPPOConfig

    cfg = DDPPOConfig(
        env=HANG,
        env_config={"hang_at": 20, "marker": str(tmp_path / "hung")},
        seed=0,
        rollout_fragment_length=32,
        minibatch_size=64,
        num_sgd_iter=2,
        torch_distributed_timeout_s=3,
        resources={"num_workers": 2, "num_envs_per_worker": 4, "num_cpus_per_worker": 0.5, "request_timeout_s": 2},
    )  # DD-PPO makes it 2 x 3 s: the peer's all-reduce fails first
    algo = cfg.build()
    try:
        results = [algo.train() for _ in range(4)]
        assert (tmp_path / "hung").exists()
        last = results[-1]
        # at least one timeout and restart: on a loaded machine a slow peer's round may time out too
        assert last["num_worker_timeouts"] >= 1 and last["num_worker_restarts"] >= last["num_worker_timeouts"]
        assert last["num_regroups"] >= 1 and last["world_size"] == 2 and last["num_failed_rounds"] >= 1
        trained = [r["env_steps_trained"] for r in results]
        assert trained[-1] > trained[-2]  # the new group trains
        state = algo.get_state()  # answers: no member is stuck
        assert state["num_regroups"] == last["num_regroups"]
    finally:
        algo.stop()


def test_group_times_out_one_request_and_keeps_the_other_actors_results(ray_cluster):
    from test_ray import Worker

    from shoal.errors import ActorLostError
    from shoal.runtime import make_actor_group

    group = make_actor_group(
        Worker, 2, lambda i: ((i,), {}), remote=True, num_cpus=0.5, request_timeout_s=1.5, name="worker"
    )
    try:
        group.foreach("get_value")  # both up: the clocks start now
        group.on_restart = lambda: [("set_value", (7,))]
        stuck = group.actors[1]
        assert group.submit("work", 3600, actor_ids=[1]) == 1 and group.submit("work", 0.1, actor_ids=[2]) == 1
        got = []
        while group.num_in_flight():
            got += group.fetch_ready(timeout_s=0.5)
        assert got == [(2, 2)]  # actor 2 answered; actor 1's request was dropped
        assert group.num_timeouts == 1 and group.num_restarts == 1 and group.num_dropped_requests == 1
        assert group.actors[1] is not stuck and group.call(1, "get_value") == 7  # recreated and re-synced
        # A blocking call on a hung actor gives up as well, with the actor replaced.
        with pytest.raises(ActorLostError, match="did not return within resources.request_timeout_s=1.5"):
            group.call(2, "work", 3600)
        assert group.num_timeouts == 2 and group.foreach("work", 0) == [1, 2]
    finally:
        group.stop()


def test_hung_evaluation_actor_is_replaced_and_the_evaluation_finishes(ray_cluster, tmp_path):
    # hang_at 5: a greedy untrained policy ends CartPole episodes within ~10 steps
    cfg = PPOConfig(
        env=HANG,
        env_config={"hang_at": 5, "marker": str(tmp_path / "hung")},
        seed=0,
        evaluation={"evaluation_num_workers": 1, "evaluation_num_episodes": 2},
        resources={"request_timeout_s": 3},
        **SMALL,
    )
    algo = cfg.build()
    try:
        out = algo.evaluate()  # nothing stepped the driver's envs: the evaluation actor's env hangs
        assert (tmp_path / "hung").exists()
        assert out["num_episodes"] == 2
        assert algo.evaluator.runners.num_timeouts == 1 and algo.evaluator.runners.num_restarts == 1
    finally:
        algo.stop()


def test_an_evaluation_actor_replaced_twice_still_finishes_and_is_counted(ray_cluster, tmp_path):
    """The probe's case: the evaluation actor and then its replacement fail; the third one evaluates."""
    cfg = PPOConfig(
        env=HANG,
        env_config={"hang_at": 5, "marker": str(tmp_path / "hung"), "times": 2},
        seed=0,
        evaluation={"evaluation_num_workers": 1, "evaluation_num_episodes": 2},
        resources={"request_timeout_s": 3},
        **SMALL,
    )
    algo = cfg.build()
    try:
        out = algo.evaluate()  # the driver's own envs never step here: only evaluation actors' envs hang
        assert (tmp_path / "hung").exists() and (tmp_path / "hung.1").exists()
        assert out["num_episodes"] == 2
        assert algo.evaluator.runners.num_restarts == 2 and algo.evaluator.runners.num_timeouts == 2
    finally:
        algo.stop()


def test_a_rollout_actor_whose_env_constructor_hangs_is_recreated(ray_cluster, tmp_path):
    """The clock of a request to an actor that never finishes starting runs from its creation."""
    cfg = PPOConfig(
        env="flaky_envs:HangInInitCartPole",
        env_config={"marker": str(tmp_path / "hung"), "driver_pid": os.getpid()},
        seed=0,
        resources={"num_workers": 1, "actor_start_timeout_s": 10},
        **SMALL,
    )
    algo = cfg.build()
    try:
        result = algo.train()  # the round with the hung actor samples nothing; its replacement then does
        for _ in range(5):
            if result["env_steps_sampled"] >= 256:
                break
            result = algo.train()
        assert (tmp_path / "hung").exists() and result["env_steps_sampled"] >= 256
        assert result["num_worker_restarts"] >= 1 and algo.env_runners.num_timeouts >= 1
        # Ray's view names the stuck process: created (a pid), constructor not returned
        assert re.search(r"Ray: PENDING_CREATION, pid [1-9]\d*, 0 CPUs free", algo.env_runners.group.last_failure)
    finally:
        algo.stop()


def test_the_drivers_own_env_construction_times_out_with_a_message():
    cfg = PPOConfig(
        env="flaky_envs:HangInInitCartPole", env_config={"always": True}, resources={"request_timeout_s": 1.0}, **SMALL
    )
    with pytest.raises(EnvError, match="did not finish within resources.request_timeout_s=1 s"):
        cfg.build()
    import signal

    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_an_actor_that_never_starts_stops_the_run_after_three_tries(ray_cluster, tmp_path, caplog):
    """Each recreated actor hangs in its constructor too: the third start timeout in a row ends the
    run (the restart budget, counted per window, would allow one restart per timeout forever)."""
    from shoal.errors import WorkerError
    from shoal.runtime.ray_group import START_TIMEOUTS_IN_A_ROW

    cfg = PPOConfig(
        env="flaky_envs:HangInInitCartPole",
        env_config={"in_actors": True},
        seed=0,
        resources={"num_workers": 1, "actor_start_timeout_s": 3},  # never starts, however long it is given
        **SMALL,
    )
    algo = cfg.build()  # the driver's own env builds: only actors hang
    try:
        with caplog.at_level(logging.WARNING, logger="shoal.runtime"), pytest.raises(WorkerError) as e:
            for _ in range(2 * START_TIMEOUTS_IN_A_ROW):  # one start timeout per round at least
                result = algo.train()
                assert result["env_steps_sampled"] == 0
        assert algo.env_runners.num_timeouts == START_TIMEOUTS_IN_A_ROW
    finally:
        algo.stop()
    text = " ".join(str(e.value).split())
    assert f"rollout actor 1 (env HangInInitCartPole) did not start {START_TIMEOUTS_IN_A_ROW} times in a row" in text
    assert "resources.actor_start_timeout_s" in text and "constructor" in text
    tries = re.findall(r"try (\d) of (\d) to start it", caplog.text)
    assert tries == [(str(k), str(START_TIMEOUTS_IN_A_ROW)) for k in range(2, START_TIMEOUTS_IN_A_ROW + 1)]


def test_start_timeouts_in_a_row_below_the_limit_let_the_run_go_on(ray_cluster, tmp_path):
    """Two actors in a row hang in their constructors, the third starts: the run trains on, and
    the start wipes the slot's count."""
    from shoal.runtime.ray_group import START_TIMEOUTS_IN_A_ROW

    hangs = START_TIMEOUTS_IN_A_ROW - 1
    cfg = PPOConfig(
        env="flaky_envs:HangInInitCartPole",
        env_config={"marker": str(tmp_path / "hung"), "driver_pid": os.getpid(), "times": hangs},
        seed=0,
        resources={"num_workers": 1, "actor_start_timeout_s": 10},  # a healthy actor starts well within it
        **SMALL,
    )
    algo = cfg.build()
    try:
        for _ in range(3 * START_TIMEOUTS_IN_A_ROW):
            result = algo.train()
            if result["env_steps_sampled"] >= 256:
                break
        assert result["env_steps_sampled"] >= 256 and algo.env_runners.num_timeouts == hangs
        assert algo.env_runners.group._start_timeouts == {}
    finally:
        algo.stop()


def test_shoal_train_reads_a_registered_ids_reward_threshold_without_building_the_env(monkeypatch):
    import gymnasium as gym

    from shoal.app.cli_config import _reward_threshold

    def no_build(*args, **kwargs):
        raise AssertionError("the env was built")

    monkeypatch.setattr(gym, "make", no_build)
    assert _reward_threshold(PPOConfig(env="CartPole-v1")) == 475.0


def test_shoal_train_without_a_stop_reward_times_out_a_hung_driver_env(tmp_path):
    """The reward threshold shoal train reads (no --stop-reward, no --no-stop-reward) is read under
    the same time limit as the algorithm's own env build: an error paragraph, exit 2, no run
    directory. A real process: before, it hung there (killed here after a generous wait)."""
    import subprocess
    import sys
    from pathlib import Path

    from helpers import flat

    args = ["train", "ppo", "--env", "flaky_envs:HangInInitCartPole", "--set", "env_config.always=true"]
    args += ["--set", "resources.request_timeout_s=1", "--stop-iters", "1", "--out", str(tmp_path / "runs")]
    r = subprocess.run(
        [sys.executable, "-m", "shoal", *args],
        cwd=Path(__file__).parent,  # flaky_envs imports from the working directory
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 2, r.stdout + r.stderr
    text = flat(r.stdout + r.stderr)
    assert "Building env 'HangInInitCartPole' in the driver (to read its reward threshold) did not finish" in text
    assert "resources.request_timeout_s=1 s" in text and "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists()


def test_a_request_queued_behind_another_is_timed_from_its_turn(ray_cluster):
    from test_ray import Worker

    from shoal.runtime import make_actor_group

    group = make_actor_group(
        Worker, 1, lambda i: ((i,), {}), remote=True, num_cpus=0.5, request_timeout_s=2.0, max_in_flight=2
    )
    try:
        group.foreach("get_value")
        assert group.submit("work", 1.2) == 1 and group.submit("work", 1.2) == 1  # 2.4 s in all, 1.2 s each
        got = []
        while group.num_in_flight():
            got += group.fetch_ready(timeout_s=0.2)
        assert got == [(1, 1), (1, 1)] and group.num_timeouts == 0
    finally:
        group.stop()
