"""Ape-X end to end: in-process runs, a dying learner thread, learning CartPole on Ray with
2 rollout actors and 2 replay shards, killed shards and actors, and shard placement on a
simulated two-node cluster. (The math is in test_dqn.py.)"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import last_json_line

from shoal.algorithms.apex import ApeXConfig
from shoal.batch import Col
from shoal.learn.threads import LearnerThreadError

torch.set_num_threads(1)
HERE = Path(__file__).resolve().parent


def in_process_config(**kw) -> ApeXConfig:
    base = dict(
        env="CartPole-v1",
        seed=0,
        min_time_s_per_iteration=0.0,
        learning_starts=256,
        train_batch_size=32,
        training_intensity=2.0,
        rollout_fragment_length=16,
        target_network_update_freq=512,
        model={"hiddens": [32]},
        resources={"num_workers": 0, "num_envs_per_worker": 4, "num_replay_shards": 2},
    )
    return ApeXConfig(**{**base, **kw})


def train_until(algo, done, max_iters: int, max_s: float, pause_s: float = 0.0) -> dict:
    """``algo.train()`` until ``done(result)``, at most ``max_iters`` iterations / ``max_s`` seconds."""
    t0, r = time.time(), {}
    for _ in range(max_iters):
        r = algo.train()
        if done(r) or time.time() - t0 > max_s:
            break
        time.sleep(pause_s)
    return r


# ---- in-process (num_workers=0) ---------------------------------------------------------
def test_num_workers_zero_trains_in_process():
    algo = in_process_config().build()
    try:
        assert algo.env_runners.actor_ids == [0] and algo.shards.actor_ids == [0, 1]
        r = train_until(algo, lambda r: r["env_steps_trained"] >= 256 and r["num_learner_updates"] >= 4, 400, 60, 0.01)
        sizes = [s["size"] for s in algo.shards.foreach("stats")]
        # every sampled step became one n-step transition in one of the two shards
        assert sum(sizes) == r["env_steps_sampled"]
        assert all(s > 0 for s in sizes), sizes  # the runner picks a random shard per batch
        assert r["num_learner_updates"] >= 4 and r["env_steps_trained"] >= 256
        # each update learns on one 32-row batch; updates not yet drained are counted later
        assert r["env_steps_trained"] % 32 == 0 and r["env_steps_trained"] <= 32 * r["num_learner_updates"]
        assert np.isfinite(r["learner/loss"])
        assert r["num_replay_shard_restarts"] == 0 and r["num_worker_restarts"] == 0
        assert 0.0 <= r["learner_busy_fraction"] <= 1.0
        # sampled priorities were replaced by the learner's TD errors
        assert sum(s["updated"] for s in algo.shards.foreach("stats")) > 0
        # the driver's runner spreads the per-actor epsilons over its 4 envs
        eps = algo.env_runners.actors[0].policy.epsilon
        assert eps.shape == (4,) and eps[0] == pytest.approx(0.4) and np.all(np.diff(eps) < 0)
        # the headline counts envs 2 and 3 only; all_envs/* every env's episodes
        assert r["all_envs/episodes_total"] > r["episodes_total"] > 0
    finally:
        algo.stop()


# ---- which episodes the headline metrics count -------------------------------------------
def test_actor_epsilons_by_hand():
    from shoal.algorithms.apex_actors import actor_epsilons

    driver = actor_epsilons(0, 3, 0.4, 7.0)  # env j of 3: 0.4 ** (1 + 7 j / 2)
    np.testing.assert_allclose(driver[0], [0.4, 0.4**4.5, 0.4**8])
    actors = actor_epsilons(3, 2, 0.4, 7.0)  # actor i of 3 (ids 1..3): one epsilon on both its envs
    assert sorted(actors) == [1, 2, 3]
    for i, eps in zip((1, 2, 3), (0.4, 0.4**4.5, 0.4**8)):
        np.testing.assert_allclose(actors[i], [eps, eps])


@pytest.mark.parametrize(
    "workers, envs, counted",
    [
        (0, 8, {0: [5, 6, 7]}),  # 8 envs in the driver: ceil(8 / 3) = 3 lowest epsilons
        (0, 3, {0: [2]}),
        (0, 2, {0: [1]}),
        (0, 1, {0: [0]}),  # at least one env
        (8, 1, {6: [0], 7: [0], 8: [0]}),  # 8 actors of one env: the same 3 envs, by actor
        (3, 1, {3: [0]}),
        (3, 4, {3: [0, 1, 2, 3]}),  # ceil(12 / 3) = 4 envs: all of actor 3 (its envs share its epsilon)
        (4, 2, {3: [0, 1], 4: [0, 1]}),  # ceil(8 / 3) = 3 envs; actor 3's second env ties with its first
        (2, 16, {2: list(range(16))}),  # the small-machine preset: the lower-epsilon actor
    ],
)
def test_reporting_envs_are_the_lowest_epsilon_third(workers, envs, counted):
    from shoal.algorithms.apex_actors import actor_epsilons, reporting_envs

    masks = reporting_envs(actor_epsilons(workers, envs, 0.4, 7.0))
    assert {i: np.flatnonzero(m).tolist() for i, m in masks.items() if m.any()} == counted
    assert all(len(m) == envs for m in masks.values())


def test_equal_epsilons_count_every_env():
    from shoal.algorithms.apex_actors import actor_epsilons, reporting_envs

    masks = reporting_envs(actor_epsilons(0, 6, 0.4, 0.0))  # exploration_alpha 0: all explore with 0.4
    assert masks[0].all()


def test_episodes_of_high_epsilon_envs_stay_out_of_the_headline():
    from shoal.rollout.env_runner import RolloutMetrics

    algo = in_process_config(resources={"num_workers": 0, "num_envs_per_worker": 8, "num_replay_shards": 1}).build()
    try:
        # env 0 explores with epsilon 0.4, envs 5 and 7 with 0.4 ** 6 and 0.4 ** 8
        m = RolloutMetrics(
            env_steps=30,
            episode_returns=[9.0, 200.0, 100.0, 11.0],
            episode_lengths=[9, 200, 100, 11],
            episode_envs=[0, 7, 5, 0],
            custom_metrics=[{"x": 1.0}, {"x": 2.0}, {"x": 3.0}, {"x": 4.0}],
        )
        assert algo.record_actor_rollouts([(0, m)]) == 30
        assert algo.episodes.metrics() == {
            "episode_return_mean": 150.0,
            "episode_return_min": 100.0,
            "episode_return_max": 200.0,
            "episode_len_mean": 150.0,
            "episodes_total": 2,
        }
        assert algo.custom_metrics == [{"x": 2.0}, {"x": 3.0}]
        everyone = algo.all_env_episodes.metrics()
        assert everyone["episode_return_mean"] == 80.0 and everyone["episodes_total"] == 4
        state = algo.get_state()
        assert state["episodes"]["returns"] == [200.0, 100.0] and state["all_env_episodes"]["total"] == 4
    finally:
        algo.stop()


def test_a_dying_learner_thread_raises_in_train_with_its_traceback():
    algo = in_process_config().build()

    def broken_loss(module, batch, learner):
        raise RuntimeError("injected Ape-X loss failure")

    algo.learner.loss_fn = broken_loss
    try:
        with pytest.raises(LearnerThreadError, match="injected Ape-X loss failure") as info:
            train_until(algo, lambda r: False, 2000, 60, 0.001)
        msg = str(info.value)
        assert "Traceback" in msg and "broken_loss" in msg, msg  # the thread's own frames
        assert not algo.learner_thread.is_alive()
    finally:
        algo.stop()


def run_until_sampled(algo, steps: int, max_s: float = 120) -> dict:
    """Train until ``steps`` env steps were sampled after learning started."""
    start = algo.config.learning_starts
    return train_until(algo, lambda r: r["env_steps_sampled"] - start >= steps, 100_000, max_s)


def slow_learner(algo, seconds: float) -> None:
    """Each SGD step also sleeps: the learner, not sampling, is the bottleneck."""
    learn = algo.learner_thread.learn_fn

    def slow(batch):
        time.sleep(seconds)
        return learn(batch)

    algo.learner_thread.learn_fn = slow


@pytest.mark.parametrize("case", ["steady", "shard_request_cap", "slow_learner"])
def test_replay_ratio_holds_the_training_intensity(case):
    """trained / sampled since learning started stays at training_intensity: owed replay requests
    are never lost (a shard at its request cap, a learner that lags) and a lagging learner holds
    sampling back instead of letting the ratio drift down."""
    kw = {"learner_queue_size": 8}
    if case == "shard_request_cap":
        kw["max_replay_requests_in_flight_per_shard"] = 1  # 2 shards take 2 of the 4 requests each step owes
    algo = in_process_config(**kw).build()
    if case == "slow_learner":
        slow_learner(algo, 0.004)
    try:
        r = run_until_sampled(algo, 5000)
        assert r["env_steps_sampled"] - algo.config.learning_starts >= 5000
        assert r["replay_ratio"] == pytest.approx(2.0, rel=0.15), r
        assert r["num_replay_batches_dropped"] == 0
        # owed work stays bounded: at most what one sampling round owes (64 steps -> 4) beyond one request
        assert r["num_replay_requests_owed"] <= 5
        trained, sampled = r["env_steps_trained"], r["env_steps_sampled"] - algo.learning_started_at[0]
        assert r["replay_ratio"] == pytest.approx(trained / sampled)
    finally:
        algo.stop()


def test_a_checkpoint_keeps_the_owed_replay_work(tmp_path):
    """Requests owed, in flight or queued at save time are owed again by the restored run."""
    from shoal.framework.base import Algorithm

    algo = in_process_config(learner_queue_size=8).build()
    try:
        run_until_sampled(algo, 1000)
        algo.learner_thread.stop()  # nothing is learned from here: this step's replay requests stay pending
        algo.train()
        pending = algo._owed + algo._replay_in_flight + algo.learner_thread.queued()
        started = algo.learning_started_at
        path = algo.save(tmp_path / "apex")
    finally:
        algo.stop()
    again = Algorithm.from_checkpoint(path)
    try:
        assert again.learning_started_at == started and again._owed == pytest.approx(pending) and pending > 0
        r = run_until_sampled(again, 4000)
        assert r["replay_ratio"] == pytest.approx(2.0, rel=0.15)  # counted over both runs
    finally:
        again.stop()


def test_replay_ratio_is_zero_before_learning_starts():
    algo = in_process_config(learning_starts=10_000).build()
    try:
        r = algo.train()
        assert r["env_steps_sampled"] < 10_000 and r["replay_ratio"] == 0.0 and r["env_steps_trained"] == 0
    finally:
        algo.stop()


def test_priorities_of_a_recreated_shard_are_dropped():
    """Batches learned after their shard was recreated (empty, a new generation) send no priorities
    to the new shard, whose slots hold other rows or none; the owed requests go to it again."""
    algo = in_process_config(
        resources={"num_workers": 0, "num_envs_per_worker": 4, "num_replay_shards": 1},
        learner_queue_size=4,
        max_weight_sync_delay=10**9,
    ).build()
    try:
        train_until(algo, lambda r: r["num_learner_updates"] >= 2, 400, 60)
        with algo.learner_thread.lock:  # the learner stops between two steps; batches wait in its queue
            for _ in range(4):
                algo.train()
            queued = algo.learner_thread.queued()
            assert queued >= 1 and algo.shards.generation(0) == 0
            algo.shards.restart(0)
        assert algo.shards.generation(0) == 1
        new = algo.shards.actors[0]
        trained = algo.counters["env_steps_trained"]
        # requests owed to the empty shard come back empty: sampling must go on and refill it
        r = train_until(algo, lambda r: new.stats()["updated"] > 0, 400, 60)
        assert r["num_stale_priority_batches"] >= queued
        assert r["num_replay_shard_restarts"] == 1
        stats = new.stats()
        assert stats["size"] > 0 and stats["updated"] > 0 and r["env_steps_trained"] > trained
        # every priority the new shard got belongs to a batch sampled from it
        assert stats["updated"] + stats["stale"] <= stats["sampled"]
    finally:
        algo.stop()


# ---- Ape-X keys inherited from DQN ------------------------------------------------------
def test_uniform_replay_and_no_worker_side_priorities():
    algo = in_process_config(prioritized_replay=False).build()
    try:
        r = train_until(algo, lambda r: r["num_learner_updates"] >= 4, 400, 60)
        stats = algo.shards.foreach("stats")
        assert all("max_priority" not in s for s in stats)  # uniform buffers
        assert sum(s["updated"] for s in stats) == 0  # no priorities are sent back
        assert r["env_steps_trained"] > 0 and np.isfinite(r["learner/loss"])
        batch = algo.shards.call(0, "sample", 16)
        np.testing.assert_array_equal(batch[Col.WEIGHTS], np.ones(16, np.float32))
    finally:
        algo.stop()
    for worker_side in (
        True,
        False,
    ):  # prioritized, learning not started: the stored priorities are the workers' or the max
        algo = in_process_config(worker_side_prioritization=worker_side, learning_starts=10_000).build()
        try:
            algo.train()
            batch, _ = algo.env_runners.call(0, "sample")
            assert (Col.PRIORITIES in batch) is worker_side
            stored = np.concatenate([s.buffer.priorities() for s in algo.shards.actors.values()])
            assert len(stored) > 0 and (len(np.unique(stored)) > 1) is worker_side
        finally:
            algo.stop()


def test_beta_is_annealed_and_sent_with_every_sample_request(monkeypatch):
    from shoal.replay import ReplayShard

    betas: list[tuple[float, float]] = []
    algo = in_process_config(
        prioritized_replay_beta=0.4, final_prioritized_replay_beta=1.0, beta_annealing_steps=2000
    ).build()
    sample = ReplayShard.sample

    def recording(shard, n, beta=None):
        betas.append((algo.counters["env_steps_sampled"], beta))
        return sample(shard, n, beta)

    monkeypatch.setattr(ReplayShard, "sample", recording)
    try:
        run_until_sampled(algo, 2500)
        assert betas
        for sampled, beta in betas:  # linear from 0.4 to 1.0 over the first 2000 sampled steps
            assert beta == pytest.approx(0.4 + 0.6 * min(1.0, sampled / 2000))
        assert betas[0][1] < 0.6 and betas[-1][1] == 1.0
    finally:
        algo.stop()


def test_lr_schedule_moves_with_sampled_env_steps():
    algo = in_process_config(lr_schedule=[[0, 1e-3], [2000, 1e-4]]).build()
    try:
        r = algo.train()
        assert algo.learner.lr == 1e-3  # learning has not started: the schedule's start
        while r["env_steps_sampled"] < 1000:
            r = algo.train()
        expected = float(np.interp(r["env_steps_sampled"], [0, 2000], [1e-3, 1e-4]))
        assert r["learner/lr"] == pytest.approx(expected)
        assert algo.learner.optimizer.param_groups[0]["lr"] == pytest.approx(expected)
        r = run_until_sampled(algo, 2500)
        assert r["learner/lr"] == pytest.approx(1e-4) and algo.learner.optimizer.param_groups[0]["lr"] == pytest.approx(
            1e-4
        )
    finally:
        algo.stop()


# ---- on Ray: 2 rollout actors, 2 replay shards ------------------------------------------
@pytest.fixture(scope="module")
def apex_on_ray(ray_cluster):
    """One Ape-X run (the small-machine preset) shared by the Ray tests below, in file order:
    learn first, then kill a replay shard, then a rollout actor."""
    cfg = ApeXConfig(
        **{**ApeXConfig.small_machine_preset(), "env": "CartPole-v1", "seed": 0, "min_time_s_per_iteration": 1.0}
    )
    algo = cfg.build()
    yield algo
    algo.stop()


@pytest.mark.ray
@pytest.mark.learning
def test_learns_cartpole_with_two_workers_and_two_shards(apex_on_ray):
    import ray

    algo = apex_on_ray
    assert sorted(algo.env_runners.actor_ids) == [1, 2] and sorted(algo.shards.actor_ids) == [0, 1]
    driver = ray.get_runtime_context().get_node_id()
    assert set(algo.shards.node_ids().values()) == {driver}
    # The preset reaches ~400 after ~22 s of training on a loaded machine; ask for 150 within 90 s.
    r = train_until(algo, lambda r: r["episode_return_mean"] >= 150, 200, 90)
    best = r["episode_return_mean"]
    assert best >= 150, f"mean return {best:.1f} after {r['env_steps_sampled']} steps, {r['time_total_s']:.0f} s"
    assert r["num_worker_restarts"] == 0 and r["num_replay_shard_restarts"] == 0
    assert r["env_steps_trained"] > 0 and r["num_learner_updates"] * 256 >= r["env_steps_trained"]
    # the preset's intensity (4) holds on Ray too: the learner sets the pace, sampling waits for it
    assert r["replay_ratio"] == pytest.approx(algo.config.training_intensity, rel=0.15), r
    assert r["num_replay_batches_dropped"] == 0
    # the target net is refreshed every 25,600 trained steps = every 100 updates of 256 rows (+-1: read racily)
    assert abs(r["num_target_updates"] - r["num_learner_updates"] // 100) <= 1
    sizes = [s["size"] for s in algo.shards.foreach("stats")]
    # an actor stores its batch before the driver collects the request's metrics: allow those in flight
    in_flight = algo.env_runners.num_in_flight() * 64 * 16  # fragment x envs per actor
    assert all(s > 0 for s in sizes) and sum(sizes) <= r["env_steps_sampled"] + in_flight


@pytest.mark.ray
def test_a_killed_replay_shard_is_recreated_empty_and_training_continues(apex_on_ray):
    import ray

    algo = apex_on_ray
    r0 = algo.train()
    assert r0["env_steps_sampled"] >= algo.config.learning_starts  # replay requests are being sent
    before = {s: algo.shards.call(s, "stats")["size"] for s in (0, 1)}
    old = algo.shards.actors[0]
    ray.kill(old, no_restart=True)
    r = train_until(algo, lambda r: r["num_replay_shard_restarts"] >= 1, 30, 60)
    assert r["num_replay_shard_restarts"] == r0["num_replay_shard_restarts"] + 1
    assert algo.shards.actors[0] is not old
    assert (algo.shards.generation(0), algo.shards.generation(1)) == (1, 0)  # priorities for shard 0 batches
    # sampled before this are dropped (num_stale_priority_batches), not sent to the new, empty shard
    # Keep training: the rollout actors got the new shard's handle and refill it.
    trained = r["env_steps_trained"]
    # A recreated shard starts a fresh process (seconds on a loaded machine) before the adds reach it.
    r = train_until(
        algo, lambda r: algo.shards.call(0, "stats")["size"] > 0 and r["env_steps_trained"] > trained, 60, 60
    )
    after = {s: algo.shards.call(s, "stats")["size"] for s in (0, 1)}
    assert r["env_steps_trained"] > trained
    assert 0 < after[0] < min(before[0], after[1]), (before, after)  # refilled from empty, not restored
    assert r["num_replay_shard_restarts"] == 1 and r["num_worker_restarts"] == 0


@pytest.mark.ray
def test_a_killed_rollout_actor_is_recreated_and_training_continues(apex_on_ray):
    import ray

    algo = apex_on_ray
    r0 = algo.train()
    old = algo.env_runners.actors[1]
    ray.kill(old, no_restart=True)
    r = train_until(algo, lambda r: r["num_worker_restarts"] >= 1, 30, 60)
    assert r["num_worker_restarts"] == r0["num_worker_restarts"] + 1
    assert algo.env_runners.actors[1] is not old
    sizes0 = {s: algo.shards.call(s, "stats")["added"] for s in (0, 1)}
    r2 = train_until(algo, lambda r: False, 3, 30)
    assert r2["env_steps_sampled"] > r["env_steps_sampled"] and r2["env_steps_trained"] > r["env_steps_trained"]
    # the recreated actor writes into the replay shards again (it got their handles on restart)
    added = algo.env_runners.call(1, "sample_into_replay").env_steps
    new_rows = 0
    for _ in range(100):  # the actor's writes are fire-and-forget: give the shards a moment
        new_rows = sum(algo.shards.call(s, "stats")["added"] for s in (0, 1)) - sum(sizes0.values())
        if new_rows >= added:
            break
        time.sleep(0.1)
    assert new_rows >= added > 0
    assert algo.env_runners.call(1, "get_weights").keys() == algo.get_weights().keys()
    assert r2["num_replay_shard_restarts"] == 1


# ---- a simulated two-node cluster -------------------------------------------------------
@pytest.mark.ray
def test_replay_shard_placement_in_a_two_node_cluster():
    """In its own process: a ``ray.cluster_utils.Cluster`` needs its own Ray instance."""
    out = last_json_line(HERE / "apex_multinode.py")
    assert out["num_nodes"] == 2
    assert out["shard_nodes"] == [out["driver_node"]]  # preset: 0-CPU shards, pinned by node affinity
    assert out["shard_nodes_with_cpus"] == [out["driver_node"]]  # 0.5-CPU shards: placement group on that node
    assert out["env_steps_trained"] > 0  # it trains with rollout actors wherever they were placed
    # Shards reserving 2 CPUs in all, more than the driver's 1-CPU node has:
    # pinned there, the build fails at once and says why and what to change;
    msg = out["pinned_error"]
    assert msg and "need 2 CPUs" in msg and "has 1 in total" in msg and out["driver_node"] in msg, msg
    assert "replay_shard_cpus" in msg and "replay_shards_on_driver_node" in msg, msg
    # not pinned, they land on the node that can hold them, and Ape-X trains across the two nodes.
    assert out["unpinned_shard_nodes"] == [out["other_node"]]
    assert out["unpinned_runner_nodes"] == [out["driver_node"]]  # the 0.5-CPU actor fits only beside the driver
    assert out["unpinned_env_steps_trained"] > 0
