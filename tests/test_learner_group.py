"""The learner group (resources.num_learners > 1): config rules, fragments by reference, the
union-batch gradient, identical replicas, a SIGKILLed learner replaced, checkpoints."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from shoal.algorithms.appo import APPOConfig
from shoal.algorithms.impala import IMPALA, IMPALAConfig
from shoal.batch import Batch, Col
from shoal.errors import ConfigError

# Two learners, two rollout actors of 5 CartPoles, 50-step fragments: 250 rows a learner per update.
SMALL = dict(
    env="CartPole-v1",
    seed=0,
    lr=0.002,
    rollout_fragment_length=50,
    train_batch_size=500,
    resources={
        "num_workers": 2,
        "num_envs_per_worker": 5,
        "num_cpus_per_worker": 0.25,
        "num_learners": 2,
        "num_cpus_per_learner": 0.5,
        "learner_collective_timeout_s": 20,
    },
)


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


def _replica_weights(algo) -> list[dict]:
    """Every replica's weights once all batches sent are learned (each has taken the same steps)."""
    algo.learner_group.wait_idle()
    group = algo.learner_group.group
    return [group.call(i, "get_weights") for i in sorted(group.actor_ids)]


# ---- config rules: each a clear error before anything starts ------------------------------------
@pytest.mark.parametrize(
    "resources, extra, says",
    [
        ({"num_workers": 0}, {}, "resources.num_workers >= 1"),
        ({"num_gpus": 1}, {}, "num_gpus_per_learner"),
        ({"num_gpus_per_learner": 2}, {}, "each learner trains on one GPU"),
        ({}, {"train_batch_size": 600}, "2 x 50 x 5 = 500"),
        ({}, {"num_learner_devices": 2, "fake_devices": True}, "multi-device learner"),
    ],
)
def test_config_rules_fail_naming_what_is_wrong(resources, extra, says):
    with pytest.raises(ConfigError) as info:
        IMPALAConfig(**{**SMALL, **extra, "resources": {**SMALL["resources"], **resources}})
    assert "num_learners=2" in str(info.value) and says in str(info.value), str(info.value)


def test_one_learner_is_the_driver_thread_and_plans_no_learner_bundles():
    one = IMPALAConfig(**{**SMALL, "resources": {**SMALL["resources"], "num_learners": 1}})
    assert [g.name for g in IMPALA.resource_plan(one)] == ["driver", "rollout actor"]
    two = IMPALAConfig(**SMALL)
    learners = [g for g in IMPALA.resource_plan(two) if g.name == "learner"]
    assert len(learners) == 1 and learners[0].count == 2 and learners[0].cpus == 0.5
    assert two.resources.learner_backend() == "gloo"
    gpu = IMPALAConfig(**{**SMALL, "resources": {**SMALL["resources"], "num_gpus_per_learner": 1}})
    assert gpu.resources.learner_backend() == "nccl"


# ---- the pieces --------------------------------------------------------------------------------
class _Pair:
    """A test actor whose method returns (data, info)."""

    def pair(self, n: int):
        return np.arange(n, dtype=np.float32), {"n": n}


@pytest.mark.ray
def test_data_by_ref_leaves_the_data_in_the_store_and_fetches_the_info(ray_cluster):
    import ray

    from shoal.runtime import make_actor_group

    group = make_actor_group(_Pair, 1, lambda i: ((), {}), remote=True, num_cpus=0.1, max_in_flight=2)
    try:
        assert group.submit("pair", 100_000, data_by_ref=True) == 1
        answers: list = []
        for _ in range(240):  # a new actor's process starts slowly on a loaded machine
            answers += [r for _, r in group.fetch_ready(timeout_s=0.5)]
            if answers:
                break
        (got,) = answers
        ref, info = got
        assert isinstance(ref, ray.ObjectRef) and info == {"n": 100_000}
        assert np.array_equal(ray.get(ref), np.arange(100_000, dtype=np.float32))
    finally:
        group.stop()


def _learned(group, n: int) -> list:
    results: list = []
    for _ in range(600):
        results += group.drain(timeout_s=0.1)
        if len(results) >= n:
            break
    assert len(results) == n, results
    return results


@pytest.mark.ray
def test_two_learners_take_the_step_one_learner_takes_on_the_union_batch(ray_cluster):
    """Data parallel, through the real group: each replica learns on its part of the round, with
    unevenly many reset rows and APPO's advantages standardized (over the union); after each
    Adam step both replicas equal the single learner that saw the union (and each other, bit for
    bit). A round where learner 1 gets nothing (its fragments lost) is still a step of both, the
    single learner's on learner 0's part; trained env steps count valid rows."""
    import ray
    import union_batch_helpers as ub

    from shoal.framework.learner_group import GroupLearner, LearnerGroup
    from shoal.runtime import make_actor_group

    cfg = ub.make_config("appo")
    parts = ub.uneven_parts(cfg)
    valid = [int(p[Col.VALID].sum()) for p in parts]
    obs_space, action_space = _spaces(cfg)
    single = cfg.algorithm_cls._policy_learner(cfg, obs_space, action_space, 0)
    start = single.get_state()
    expected = [ub.one_step(single.learner, Batch.concat(parts))[1], ub.one_step(single.learner, parts[0])[1]]
    assert not _equal(expected[0], cfg.algorithm_cls._policy_learner(cfg, obs_space, action_space, 0).get_weights())

    def make():
        return make_actor_group(
            GroupLearner,
            2,
            lambda i: ((cfg, i, obs_space, action_space), {}),
            remote=True,
            num_cpus=0.5,
            max_in_flight=64,
            name="learner",
            first_index=0,
        )

    group = LearnerGroup(make, num_learners=2, queue_size=2, local_state=lambda: start, on_weights=lambda ref: None)
    try:
        group.start()
        refs = [ray.put(p) for p in parts]
        for k, (round_refs, steps) in enumerate([([[refs[0]], [refs[1]]], sum(valid)), ([[refs[0]], []], valid[0])]):
            assert group.add(round_refs, sampled_steps=0)
            results = _learned(group, 2)
            assert sum(r.env_steps for r in results) == steps  # valid rows, not rows
            got = [group.group.call(i, "get_weights") for i in (0, 1)]
            assert _equal(got[0], got[1])
            for key in expected[k]:
                np.testing.assert_allclose(got[0][key], expected[k][key], rtol=1e-6, atol=1e-6, err_msg=f"{k} {key}")
        assert group.num_updates == 2 and group.num_regroups == 0
    finally:
        group.stop()


def _spaces(cfg):
    import gymnasium as gym

    env = gym.make(cfg.env)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


# ---- the union batch's step, at the level of the math (two gloo processes, no Ray) -------------------
def _spawn_ranks(target, world: int, *args):
    import torch.multiprocessing as mp

    from shoal.learn.distributed import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, *args, out)) for r in range(world)]
    for p in procs:
        p.start()
    return procs, out


def _per_replica_mean_step(cfg, start, parts) -> np.ndarray:
    """The gradient the group used to apply: each replica's own (standardized over its own part),
    averaged with equal weights."""
    import union_batch_helpers as ub

    from shoal.learn.distributed import flatten_grads

    grads = []
    for part in parts:
        policy = cfg.algorithm_cls._policy_learner(cfg, *ub.spaces(cfg), 0)
        policy.set_state(start)
        policy.learner.compute_gradients(part.to_torch())
        grads.append(flatten_grads(policy.learner.params).numpy().copy())
    return np.mean(grads, axis=0)


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.timeout(240)
def test_two_replicas_take_one_learners_step_on_the_union_batch_with_reset_rows_and_standardized_advantages():
    """Replicas holding unevenly many valid rows (reset rows inside their fragments), advantages
    standardized: both replicas' all-reduced gradient, and their weights after the step, are those
    of one learner on the concatenated batch (to 1e-6), for IMPALA's and APPO's losses. A replica
    with an empty batch (every fragment of its round lost) takes part with zero weight: the step is
    the other replica's batch's, and both replicas take it."""
    import union_batch_helpers as ub

    cases, expected = [], []
    for algo in ("impala", "appo"):
        cfg = ub.make_config(algo)
        parts = ub.uneven_parts(cfg)
        single = cfg.algorithm_cls._policy_learner(cfg, *ub.spaces(cfg), 0)
        start = single.get_state()
        want = ub.one_step(single.learner, Batch.concat(parts))
        # the data exercises the fix: the old unweighted mean of per-replica steps is far off
        assert _relative_error(_per_replica_mean_step(cfg, start, parts), want[0]) > 0.05
        cases.append((algo, {}, start, parts))
        expected.append(want)
    single = cfg.algorithm_cls._policy_learner(cfg, *ub.spaces(cfg), 0)
    single.set_state(start)
    cases.append(("appo", {}, start, [parts[0], None]))
    expected.append(ub.one_step(single.learner, parts[0]))

    procs, out = _spawn_ranks(ub.union_rank, 2, cases)
    got = dict(out.get(timeout=180) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    assert sorted(got) == [0, 1] and all(len(g) == len(cases) for g in got.values())
    for case, (want_grad, want_weights), r0, r1 in zip(cases, expected, got[0], got[1]):
        assert np.array_equal(r0[0], r1[0]) and _equal(r0[1], r1[1]), case[0]  # the replicas stay equal
        np.testing.assert_allclose(r0[0], want_grad, rtol=1e-6, atol=1e-6, err_msg=case[0])
        for k in want_weights:
            np.testing.assert_allclose(r0[1][k], want_weights[k], rtol=1e-6, atol=1e-6, err_msg=f"{case[0]} {k}")


def test_a_member_counts_valid_rows_as_trained_steps_and_learns_an_empty_batch_with_zero_weight():
    """Alone (no process group), a group member's thread: a batch's trained env steps are its valid
    rows (a single learner's count, not its rows with the reset rows), and an empty batch is still
    a step (its result trains 0 steps and the weights stay), so replicas keep step in a group."""
    import union_batch_helpers as ub

    from shoal.framework.learner_group import _GroupThread
    from shoal.learn.distributed import UnionBatchLearner

    cfg = ub.make_config("appo")
    parts = ub.uneven_parts(cfg)
    policy = cfg.algorithm_cls._policy_learner(cfg, *ub.spaces(cfg), 0, learner_cls=UnionBatchLearner)
    thread = _GroupThread(policy, learner_queue_size=4, name="test-group-thread")
    thread.start()
    try:
        thread.offer((parts[1], 0, None))
        results = []
        for _ in range(200):
            results += thread.drain(timeout_s=0.05)
            if results:
                break
        (r,) = results
        assert r.env_steps == int(parts[1][Col.VALID].sum()) < len(parts[1]) == r.agent_steps
        before = policy.get_weights()
        thread.offer((Batch.concat([]), 0, None))
        for _ in range(200):
            results = thread.drain(timeout_s=0.05)
            if results:
                break
        (r,) = results
        assert (r.env_steps, r.agent_steps) == (0, 0) and "policy_loss" not in r.stats  # no loss of its own
        assert thread.num_updates == 2 and policy.learner.num_empty_steps == 1
        assert _equal(policy.get_weights(), before)  # alone, a zero-weight step moves nothing
    finally:
        thread.stop()


# ---- whole runs --------------------------------------------------------------------------------
@pytest.mark.ray
@pytest.mark.learning
def test_a_sigkilled_learner_is_replaced_and_the_run_reaches_its_threshold(ray_cluster):
    algo = IMPALAConfig(**SMALL).build()
    try:
        first = [algo.train() for _ in range(3)]
        assert first[-1]["num_learner_results"] > 0 and first[-1]["num_learners"] == 2
        victim = algo.learner_group.group.call(1, "pid")
        os.kill(victim, signal.SIGKILL)
        best, result = -1.0, first[-1]
        for _ in range(80):
            result = algo.train()
            best = max(best, result.get("episode_return_mean", float("nan")) or -1.0)
            if best >= 150 and result["num_learner_regroups"] >= 1:
                break
        assert result["num_learner_restarts"] == 1 and result["num_learner_regroups"] == 1, result
        assert best >= 150, f"best mean return {best:.1f} after {result['env_steps_sampled']} steps"
        assert algo.learner_group.group.call(1, "pid") != victim
        replicas = _replica_weights(algo)
        assert _equal(replicas[0], replicas[1])  # the re-formed group's replicas stayed equal
        assert _equal(algo.get_weights(), replicas[0])  # the driver's copy is learner 0's
    finally:
        algo.stop()


@pytest.mark.ray
def test_appo_with_two_learners_checkpoints_and_resumes_its_learners(ray_cluster, tmp_path):
    cfg = APPOConfig(**SMALL, use_kl_loss=True, num_sgd_iter=2, minibatch_buffer_size=2)
    algo = cfg.build()
    try:
        for _ in range(2):
            result = algo.train()
        assert result["num_learner_results"] > 0 and result["num_learner_batches_lost"] == 0
        replicas = _replica_weights(algo)
        assert _equal(replicas[0], replicas[1])
        path = algo.save(tmp_path)
        saved = algo.get_weights()
    finally:
        algo.stop()
    resumed = cfg.build()
    try:
        resumed.restore(path)
        assert _equal(resumed.get_weights(), saved)  # before the learners start: the driver's copy
        for _ in range(30):  # the learner processes start within the first iterations
            if resumed.train()["num_learner_results"] > 0:
                break
        replicas = _replica_weights(resumed)
        assert _equal(replicas[0], replicas[1]) and not _equal(replicas[0], saved)  # trained on from there
    finally:
        resumed.stop()


@pytest.mark.timeout(300)
def test_the_benchmark_compares_one_learner_with_two_and_prints_the_speedup():
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "learner_group.py"
    args = ["--shape", "cartpole", "--seconds", "2", "--warmup-s", "3", "--train-batch-size", "256"]
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["benchmark"] == "learner_group" and out["speedup_2_vs_1"] > 0
    assert out["speedup_2_vs_1_same_threads"] > 0
    one, two, same = out["runs"]
    assert one["num_learners"] == 1 and two["num_learners"] == 2
    assert same["num_learners"] == 1 and same["torch_threads"] == 2 and one["torch_threads"] == 1
    assert one["trained_rows_per_s"] > 0 and two["trained_rows_per_s"] > 0 and same["trained_rows_per_s"] > 0
    assert two["learner_batches_lost"] == 0 and two["allreduce_ms"] is not None


@pytest.mark.ray
def test_a_config_change_reaches_every_learner_at_the_same_step(ray_cluster):
    algo = IMPALAConfig(**SMALL).build()
    try:
        algo.train()
        algo.update_config({"lr": 0.0005, "entropy_coeff": 0.02})
        algo.train()
        group = algo.learner_group
        replicas = _replica_weights(algo)
        assert _equal(replicas[0], replicas[1])  # the new lr came in with the same batch on both
        states = [group.group.call(i, "get_state") for i in sorted(group.group.actor_ids)]
        lrs = [s["learner"]["optimizer"]["param_groups"][0]["lr"] for s in states]
        assert lrs == [0.0005, 0.0005]
        losses = [group.group.call(i, "loss_config") for i in sorted(group.group.actor_ids)]
        assert all(c["entropy_coeff"] == 0.02 for c in losses)
    finally:
        algo.stop()


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_learners_on_other_nodes_than_the_actor_train_and_stay_equal():
    """In its own process (a ``ray.cluster_utils.Cluster`` needs its own Ray instance): fragments
    reach the learners by reference from another node, learner 0's weights go back to the actor's."""
    from pathlib import Path

    from helpers import last_json_line

    out = last_json_line(Path(__file__).resolve().parent / "learner_group_multinode.py", timeout_s=280)
    assert out["num_nodes"] == 3
    # three 1-CPU nodes, three 1-CPU actors: the rollout actor and each learner on a node of its own
    learners, runners = out["learner_nodes"], out["runner_nodes"]
    assert len(runners) == 1 and len(set(learners + runners)) == 3
    assert out["num_learner_results"] >= 20 and out["env_steps_trained"] > 0
    assert out["replicas_equal"] and out["lost_fragments"] == 0


@pytest.mark.ray
def test_a_group_that_loses_every_learner_resumes_from_the_last_broadcast_weights(ray_cluster):
    import ray

    algo = IMPALAConfig(**SMALL).build()
    try:
        initial = algo.get_weights()
        for _ in range(30):
            if algo.train()["num_learner_results"] >= 10:
                break
        group = algo.learner_group
        group.wait_idle()
        algo.broadcast_weights()  # learner 0's weights, published by reference
        for _ in range(200):
            group.drain(timeout_s=0.05)
            if not group._weights_asked:
                break
        published = ray.get(algo.publisher.latest())
        assert not _equal(published, initial)
        for pid in [group.group.call(i, "pid") for i in sorted(group.group.actor_ids)]:
            os.kill(pid, signal.SIGKILL)
        group.group.submit("report", actor_ids=[0, 1])  # their failure recreates both learners
        for _ in range(600):  # and the next drain re-forms the group
            group.drain(timeout_s=0.1)
            if group.num_regroups:
                break
        assert group.num_regroups == 1 and group.group.num_restarts == 2
        replicas = _replica_weights(algo)
        assert _equal(replicas[0], published) and _equal(replicas[1], published)  # not the initial weights
        result = algo.train()
        for _ in range(30):
            if result["num_learner_results"] > 0:
                break
            result = algo.train()
        assert result["num_learner_results"] > 0  # and it trains on
    finally:
        algo.stop()
