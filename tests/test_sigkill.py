"""SIGKILL from outside (the OS's kill, not ray.kill) of each kind of actor, mid-run: the run
goes on, the restart is counted for that kind of actor, and training continues."""

from __future__ import annotations

import os
import signal
import time

import pytest

pytestmark = pytest.mark.ray

WORKERS = {"num_workers": 2, "num_envs_per_worker": 4, "num_cpus_per_worker": 0.5}


def sigkill(handle) -> int:
    """Kill the process behind a Ray actor handle with SIGKILL; its pid."""
    import ray

    pid = ray.get(handle.__ray_call__.remote(lambda self: os.getpid()))
    assert pid != os.getpid()
    os.kill(pid, signal.SIGKILL)
    return pid


def train_until(algo, done, max_s: float = 90.0) -> dict:
    t0, r = time.monotonic(), algo.train()
    while not done(r) and time.monotonic() - t0 < max_s:
        r = algo.train()
    return r


def _kill_rollout_actor(algo, actor_id: int, recovered) -> dict:
    """SIGKILL rollout actor ``actor_id``; train until ``recovered(result)``; check it was replaced."""
    old = algo.env_runners.actors[actor_id]
    sigkill(old)
    r = train_until(algo, recovered)
    assert algo.env_runners.actors[actor_id] is not old
    return r


def _trains_on(algo, r: dict, iterations: int = 2) -> dict:
    trained = r["env_steps_trained"]
    r2 = train_until(algo, lambda x: x["env_steps_trained"] > trained and x["iteration"] >= r["iteration"] + iterations)
    assert r2["env_steps_trained"] > trained, (r, r2)
    return r2


@pytest.mark.parametrize("algo_name", ["ppo", "impala", "appo"])
def test_sigkilled_rollout_actor_is_recreated(ray_cluster, algo_name):
    from shoal.algorithms import get_config_class

    extra = {"ppo": dict(minibatch_size=128, num_sgd_iter=1)}.get(algo_name, {})
    cfg = get_config_class(algo_name)(
        env="CartPole-v1", seed=0, rollout_fragment_length=32, train_batch_size=256, resources=WORKERS, **extra
    )
    algo = cfg.build()
    try:
        train_until(algo, lambda x: x["env_steps_trained"] > 0)
        r = _kill_rollout_actor(algo, 1, lambda x: x["num_worker_restarts"] >= 1)
        assert r["num_worker_restarts"] == 1 and r["num_worker_timeouts"] == 0
        r = _trains_on(algo, r)
        assert r["num_worker_restarts"] == 1
        assert len(algo.env_runners.foreach("get_weights")) == 2  # the new actor answers too
    finally:
        algo.stop()


def test_apex_sigkilled_rollout_actor_and_replay_shard(ray_cluster):
    from shoal.algorithms.apex import ApeXConfig

    cfg = ApeXConfig(
        **{**ApeXConfig.small_machine_preset(), "env": "CartPole-v1", "seed": 0, "min_time_s_per_iteration": 0.5}
    )
    algo = cfg.build()
    try:
        r = train_until(algo, lambda x: x["env_steps_trained"] > 0)
        old_actor, old_shard = algo.env_runners.actors[1], algo.shards.actors[0]
        sigkill(old_actor)
        sigkill(old_shard)
        r = train_until(algo, lambda x: x["num_worker_restarts"] >= 1 and x["num_replay_shard_restarts"] >= 1)
        assert r["num_worker_restarts"] == 1 and r["num_replay_shard_restarts"] == 1, r
        assert algo.env_runners.actors[1] is not old_actor and algo.shards.actors[0] is not old_shard
        _trains_on(algo, r)
        r = train_until(algo, lambda x: algo.shards.call(0, "stats")["size"] > 0)  # the new shard fills again
        assert algo.shards.call(0, "stats")["size"] > 0
    finally:
        algo.stop()


def test_ddppo_sigkilled_worker_is_replaced_and_the_group_reforms(ray_cluster):
    from shoal.algorithms.ddppo import DDPPOConfig

    cfg = DDPPOConfig(
        env="CartPole-v1",
        seed=0,
        rollout_fragment_length=32,
        minibatch_size=64,
        num_sgd_iter=2,
        torch_distributed_timeout_s=10,
        resources=WORKERS,
    )
    algo = cfg.build()
    try:
        algo.train()
        r = _kill_rollout_actor(algo, 2, lambda x: x["num_regroups"] >= 1)
        assert r["num_worker_restarts"] == 1 and r["num_regroups"] == 1
        r = _trains_on(algo, r)
        assert r["world_size"] == 2 and r["num_regroups"] == 1
    finally:
        algo.stop()


def test_league_sigkilled_rollout_actor_policy_learner_and_replay_actor(ray_cluster):
    from test_alpha_star import FAST_LEAGUE, small

    cfg = small(
        resources={
            "num_workers": 1,
            "num_cpus_per_worker": 0.25,
            "num_envs_per_worker": 8,
            "num_cpus_per_learner": 0.25,
        },
        league={**FAST_LEAGUE, "num_main_exploiters": 0, "num_league_exploiters": 0},
    )
    algo = cfg.build()
    try:
        r = train_until(algo, lambda x: x["env_steps_trained"] > 0)
        runner = algo.env_runners.actors[1]
        learner = algo.learners.get_policy_actor("main").handle
        shard = algo.learners.where["main"][0]
        replay = algo.learners.replays.actors[shard]
        for handle in (runner, learner, replay):
            sigkill(handle)
        r = train_until(
            algo,
            lambda x: (
                x["num_worker_restarts"] >= 1 and x["num_learner_restarts"] >= 1 and x["num_replay_actor_restarts"] >= 1
            ),
        )
        assert (r["num_worker_restarts"], r["num_learner_restarts"], r["num_replay_actor_restarts"]) == (1, 1, 1), r
        assert algo.env_runners.actors[1] is not runner and algo.learners.replays.actors[shard] is not replay
        _trains_on(algo, r)
    finally:
        algo.stop()
