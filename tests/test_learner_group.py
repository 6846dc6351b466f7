"""The learner group (resources.num_learners > 1): config rules, fragments by reference, the
union-batch gradient, identical replicas, a SIGKILLed learner replaced, checkpoints."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import torch

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


def _first_fragment(cfg, index: int) -> Batch:
    """One fragment of fresh CartPoles: 4 steps cannot end an episode, so every row is valid."""
    from shoal.rollout import ActorCriticPolicy
    from shoal.rollout.env_runner import EnvRunner
    from shoal.rollout.postprocessing import sequence_postprocess

    runner = EnvRunner(cfg, index, ActorCriticPolicy, sequence_postprocess, cfg.fragment_length())
    try:
        batch, _ = runner.sample()
    finally:
        runner.stop()
    assert bool(np.all(batch[Col.VALID])), "a 4-step fragment of fresh CartPoles should have no reset rows"
    return batch


@pytest.mark.ray
def test_two_learners_take_the_step_one_learner_takes_on_the_union_batch(ray_cluster):
    """Data parallel: each replica learns on half the batch, the averaged gradient equals the
    gradient of the whole batch, so after one Adam step both replicas equal the single learner
    that saw the union (and each other, bit for bit)."""
    import ray

    from shoal.algorithms.learner_group import GroupLearner, LearnerGroup
    from shoal.runtime import make_actor_group

    small = {"rollout_fragment_length": 4, "train_batch_size": 16, "lr": 0.01, "grad_clip": 0.5}
    cfg = IMPALAConfig(**{**SMALL, **small, "resources": {**SMALL["resources"], "num_envs_per_worker": 2}})
    halves = [_first_fragment(cfg, 1), _first_fragment(cfg, 2)]
    info_runner = halves[0]
    obs_space, action_space = _spaces(cfg)
    single = IMPALA._policy_learner(cfg, obs_space, action_space, 0)
    start = single.get_state()
    single.learner.update_minibatch(Batch.concat(halves).to_torch("cpu"))
    expected = single.get_weights()
    assert not _equal(expected, IMPALA._policy_learner(cfg, obs_space, action_space, 0).get_weights())

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
        assert group.add([[ray.put(halves[0])], [ray.put(halves[1])]], sampled_steps=0)
        results = []
        for _ in range(600):
            results += group.drain(timeout_s=0.1)
            if len(results) == 2:
                break
        assert len(results) == 2 and sum(r.env_steps for r in results) == len(info_runner) * 2
        got = [group.group.call(i, "get_weights") for i in (0, 1)]
        assert _equal(got[0], got[1])
        for k in expected:
            torch.testing.assert_close(torch.tensor(got[0][k]), torch.tensor(expected[k]), atol=1e-6, rtol=1e-5)
        assert group.num_updates == 1 and group.num_regroups == 0
    finally:
        group.stop()


def _spaces(cfg):
    import gymnasium as gym

    env = gym.make(cfg.env)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


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
    args = ["--shape", "cartpole", "--seconds", "3", "--warmup-s", "4", "--train-batch-size", "256"]
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["benchmark"] == "learner_group" and out["speedup_2_vs_1"] > 0
    one, two = out["runs"]
    assert one["num_learners"] == 1 and two["num_learners"] == 2
    assert one["trained_rows_per_s"] > 0 and two["trained_rows_per_s"] > 0
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
        published = ray.get(algo._weights_ref)
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
