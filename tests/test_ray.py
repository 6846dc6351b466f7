"""Ray integration: rollout actors on a local Ray instance, restarts, resources, async requests."""

from __future__ import annotations

import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from shoal import PPOConfig
from shoal.errors import ResourceError, WorkerError

pytestmark = pytest.mark.ray

SMALL = dict(train_batch_size=512, minibatch_size=256, num_sgd_iter=2)


def _weights_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


def test_two_workers_sample_in_parallel_and_get_the_learners_weights(ray_cluster):
    algo = PPOConfig(env="CartPole-v1", seed=1, resources={"num_workers": 2, "num_envs_per_worker": 4}, **SMALL).build()
    try:
        assert sorted(algo.env_runners.actor_ids) == [1, 2]
        r1 = algo.train()
        r2 = algo.train()
        # 512 steps per round over 2 actors x 4 envs (64-step fragments), minus reset steps.
        assert 400 < r1["env_steps_sampled"] <= 512
        assert r2["env_steps_sampled"] > r1["env_steps_sampled"]
        assert r2["env_steps_trained"] == r2["env_steps_sampled"]
        assert r2["num_worker_restarts"] == 0
        # Weights were broadcast after the last update: every actor holds the learner's.
        learner_w = algo.get_weights()
        for w in algo.env_runners.foreach("get_weights"):
            assert _weights_equal(w, learner_w)
        # The two actors use different seeds, so their fragments differ.
        b1, b2 = [b for b, _ in algo.env_runners.foreach("sample")]
        assert not np.array_equal(b1["obs"], b2["obs"])
    finally:
        algo.stop()


def test_killed_rollout_actor_is_recreated_and_resynced(ray_cluster):
    import ray

    algo = PPOConfig(env="CartPole-v1", seed=2, resources={"num_workers": 2, "num_envs_per_worker": 4}, **SMALL).build()
    try:
        algo.train()
        ray.kill(algo.env_runners.actors[1], no_restart=True)
        r = algo.train()  # the dead actor's request fails: dropped, actor recreated
        assert r["num_worker_restarts"] == 1
        r = algo.train()  # both actors sample again
        assert r["num_worker_restarts"] == 1
        steps_before = r["env_steps_sampled"]
        r = algo.train()
        assert r["env_steps_sampled"] - steps_before > 400  # both actors contributed
        learner_w = algo.get_weights()
        for w in algo.env_runners.foreach("get_weights"):
            assert _weights_equal(w, learner_w)
    finally:
        algo.stop()


class FlakyEnv(gym.Env):
    """CartPole that raises on its 30th step when ``marker`` does not exist yet (creating it), or always."""

    def __init__(self, marker: str = "", always: bool = False):
        self.inner = gym.make("CartPole-v1")
        self.observation_space, self.action_space = self.inner.observation_space, self.inner.action_space
        self.marker, self.always, self.n = marker, always, 0

    def reset(self, *, seed=None, options=None):
        return self.inner.reset(seed=seed, options=options)

    def step(self, action):
        self.n += 1
        if self.n == 30 and (self.always or not Path(self.marker).exists()):
            if self.marker:
                Path(self.marker).touch()
            raise RuntimeError("simulated env crash")
        return self.inner.step(action)


def test_env_that_raises_inside_an_actor_is_recreated_there_and_training_goes_on(ray_cluster, tmp_path):
    marker = str(tmp_path / "crashed-once")
    algo = PPOConfig(
        env=FlakyEnv,
        env_config={"marker": marker},
        seed=3,
        resources={"num_workers": 2, "num_envs_per_worker": 2},
        **SMALL,
    ).build()
    try:
        results = [algo.train() for _ in range(3)]
        assert Path(marker).exists()
        assert results[-1]["num_env_failures"] == 1  # the actor rebuilt its env; the actor itself lives on
        assert results[-1]["num_worker_restarts"] == 0
        assert results[-1]["env_steps_sampled"] > results[0]["env_steps_sampled"]
    finally:
        algo.stop()


def test_env_that_always_raises_ends_the_run_with_its_error(ray_cluster):
    # each actor gives up after 2 failed env rebuilds (EnvFailureError), which costs it a restart
    algo = PPOConfig(
        env=FlakyEnv,
        env_config={"always": True},
        seed=4,
        max_consecutive_env_failures=2,
        resources={"num_workers": 1, "num_envs_per_worker": 1, "max_worker_restarts": 2},
        **SMALL,
    ).build()
    try:
        with pytest.raises(WorkerError, match="simulated env crash") as info:
            for _ in range(10):
                algo.train()
        assert "max_worker_restarts" in str(info.value)
    finally:
        algo.stop()


def test_more_actors_than_cpus_fails_at_once_with_advice(ray_cluster):
    algo = PPOConfig(env="CartPole-v1", resources={"num_workers": 3}, **SMALL).build()  # actors start when needed
    try:
        t0 = time.perf_counter()
        with pytest.raises(ResourceError, match="num_cpus_per_worker") as info:
            algo.train()
        assert time.perf_counter() - t0 < 10
        assert "3 CPUs" in str(info.value) and "2 in total" in str(info.value)
    finally:
        algo.stop()


def test_restored_algorithm_starts_its_actors_with_the_restored_weights(ray_cluster, tmp_path):
    from shoal import Algorithm

    cfg = PPOConfig(env="CartPole-v1", seed=5, resources={"num_workers": 2, "num_envs_per_worker": 2}, **SMALL)
    with cfg.build() as algo:
        first = algo.train()
        path = algo.save(tmp_path / "ck")
        saved = algo.get_weights()
    with Algorithm.from_checkpoint(path) as restored:
        restored.evaluate(num_episodes=1)
        restored.save(tmp_path / "again")
        assert not restored.env_runners.created  # neither evaluating nor saving needed the actors
        for w in restored.env_runners.foreach("get_weights"):  # creates them: they hold the restored weights
            assert _weights_equal(w, saved)
        r = restored.train()
        assert r["iteration"] == 2 and r["env_steps_sampled"] > first["env_steps_sampled"]
        assert sorted(restored.env_runners.actor_ids) == [1, 2] and r["num_worker_restarts"] == 0


def test_fractional_cpus_let_more_actors_than_cores_run(ray_cluster):
    algo = PPOConfig(
        env="CartPole-v1", resources={"num_workers": 3, "num_cpus_per_worker": 0.5, "num_envs_per_worker": 2}, **SMALL
    ).build()
    try:
        assert algo.train()["env_steps_sampled"] > 0
        assert len(algo.env_runners.actor_ids) == 3
    finally:
        algo.stop()


class Worker:
    """A tiny actor for the asynchronous request pattern."""

    def __init__(self, index: int):
        self.index = index
        self.value = 0

    def work(self, delay: float):
        time.sleep(delay)
        return self.index

    def set_value(self, v):
        self.value = v

    def get_value(self):
        return self.value


def test_async_requests_keep_k_in_flight_and_collect_only_what_is_ready(ray_cluster):
    from shoal.runtime import make_actor_group

    group = make_actor_group(Worker, 2, lambda i: ((i,), {}), remote=True, num_cpus=0.5, max_in_flight=2)
    try:
        assert group.submit("work", 0.5) == 2
        assert group.submit("work", 0.5) == 2
        assert group.submit("work", 0.5) == 0  # both actors already have 2 in flight
        assert group.num_in_flight() == 4 and group.num_in_flight(1) == 2
        assert group.fetch_ready(timeout_s=0) == []  # nothing finished yet; no blocking
        got = []
        deadline = time.time() + 180  # ends as soon as all four are in; actors start slowly on a loaded machine
        while len(got) < 4 and time.time() < deadline:
            got += group.fetch_ready(timeout_s=0.2)
        assert sorted(i for i, _ in got) == [1, 1, 2, 2]
        assert all(i == r for i, r in got)
        assert group.num_in_flight() == 0
    finally:
        group.stop()


def test_dead_actor_requests_are_dropped_and_the_new_actor_is_resynced(ray_cluster):
    import ray

    from shoal.runtime import make_actor_group

    group = make_actor_group(Worker, 2, lambda i: ((i,), {}), remote=True, num_cpus=0.5, max_in_flight=3)
    group.on_restart = lambda: [("set_value", (42,))]
    try:
        group.submit("work", 2.0, actor_ids=[1])
        group.submit("work", 2.0, actor_ids=[1])
        ray.kill(group.actors[1], no_restart=True)
        deadline = time.time() + 180  # ends once both failed requests are seen
        while group.num_in_flight() and time.time() < deadline:
            group.fetch_ready(timeout_s=0.2)
        assert group.num_restarts == 1  # two failed requests, one restart
        assert group.num_dropped_requests == 2
        assert group.call(1, "get_value") == 42
        assert group.call(2, "get_value") == 0
        assert (group.generation(1), group.generation(2)) == (1, 0)  # per actor, bumped by its restart
    finally:
        group.stop()


def _kill_and_wait(handle) -> None:
    """ray.kill a started actor, then wait until it is really gone: the kill is asynchronous, and a
    call sent right after it may still be served by the old actor. The actor is waited for first, so
    the kill hits a running actor, the case these tests are about, not one Ray is still creating."""
    import ray

    ray.get(handle.__ray_ready__.remote(), timeout=120)
    ray.kill(handle, no_restart=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            ray.get(handle.get_value.remote(), timeout=30)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            continue
        time.sleep(0.1)
    raise AssertionError("the killed actor kept answering")


@pytest.mark.timeout(150)  # seconds when healthy; one CI run hung 300 s on the replacement actor (not reproduced)
def test_restarts_are_budgeted_per_rolling_window(ray_cluster):

    from shoal.errors import WorkerError
    from shoal.runtime import ActorResources, make_actor_group

    now = [0.0]
    group = make_actor_group(
        Worker,
        1,
        lambda i: ((i,), {}),
        remote=True,
        resources=ActorResources(num_cpus=0.5, max_restarts=1, restart_window_s=60.0),
    )
    group.restart_budget.clock = lambda: now[0]
    try:
        for t in (0.0, 61.0):  # one restart a minute is within the budget, however many minutes
            now[0] = t
            _kill_and_wait(group.actors[1])
            group.foreach("get_value")
            assert group.call(1, "get_value") == 0  # a fresh actor answers
        now[0] = 90.0  # a second death within 60 s of the last restart
        _kill_and_wait(group.actors[1])
        with pytest.raises(WorkerError, match="restarted 1 times in the last 60 s"):
            group.foreach("get_value")
        assert group.num_restarts == 2
    finally:
        group.stop()


def test_local_group_has_the_same_interface():
    from shoal.runtime import make_actor_group

    group = make_actor_group(Worker, 2, lambda i: ((i,), {}), remote=False, max_in_flight=1)
    assert group.actor_ids == [1, 2]
    assert group.foreach("work", 0) == [1, 2]
    assert group.submit("work", 0) == 2
    assert group.submit("work", 0) == 0
    assert sorted(group.fetch_ready()) == [(1, 1), (2, 2)]
    assert group.put("x") == "x"
    # restart: a fresh object in the slot, its queued result dropped, on_restart replayed, a new generation
    group.on_restart = lambda: [("set_value", (42,))]
    group.foreach("set_value", 7)
    assert group.submit("work", 0) == 2
    old = group.actors[1]
    group.restart(1)
    assert group.actors[1] is not old and group.call(1, "get_value") == 42 and group.call(2, "get_value") == 7
    assert group.fetch_ready() == [(2, 2)] and group.num_dropped_requests == 1
    assert group.num_restarts == 1 and (group.generation(1), group.generation(2)) == (1, 0)
    assert group.submit("work", 0) == 2  # the slot takes requests again
    group.stop()


def test_small_broadcasts_travel_inline_and_large_ones_through_the_object_store(ray_cluster):
    """A put under 64 KiB is the object itself (no object-store round trip, and no call into the
    raylet's store that a dying raylet could end the process in); larger ones are one reference.
    Either way every actor, a recreated one included, ends up with the learner's weights."""
    import ray

    from shoal.runtime.ray_group import INLINE_BYTES, _nbytes

    assert _nbytes({"w": np.zeros((4, 4), np.float32), "b": [np.zeros(3), 1.5, "x"], "n": None}) == 64 + 24 + 8 + 9 + 8
    assert _nbytes({"w": np.zeros(INLINE_BYTES)}) == INLINE_BYTES  # stops counting at the limit
    assert _nbytes(object()) == INLINE_BYTES  # unknown objects are never inlined
    for hidden, inline in ((16, True), (256, False)):
        algo = PPOConfig(
            env="CartPole-v1", seed=3, model={"hiddens": [hidden, hidden]}, resources={"num_workers": 1}, **SMALL
        ).build()
        try:
            algo.train()
            assert isinstance(algo.publisher.latest(), ray.ObjectRef) is not inline, hidden
            ray.kill(algo.env_runners.actors[1], no_restart=True)
            algo.train()
            assert algo.train()["num_worker_restarts"] == 1
            learner_w = algo.get_weights()
            assert _weights_equal(algo.env_runners.foreach("get_weights")[0], learner_w)
        finally:
            algo.stop()
