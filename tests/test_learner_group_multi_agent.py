"""Learner groups for a multi_agent section (resources.num_learners > 1): each learning policy
trained by its own group of K learners, replicas identical after updates, a SIGKILLed replica
replaced, and the learners' CPUs counted per learning policy."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from shoal.algorithms.appo import APPO, APPOConfig
from shoal.errors import ResourceError

# Two poles, each its own policy; one rollout actor of 2 envs, 25-tick fragments: 1 fragment a learner.
SMALL = dict(
    env="shoal.envs.multi_cartpole:parallel_env",
    env_config={"num_agents": 2},
    seed=0,
    lr=0.002,
    rollout_fragment_length=25,
    train_batch_size=100,
    min_time_s_per_iteration=0,
    multi_agent={"policies": {"p0": None, "p1": None}, "policy_mapping": {"agent_0": "p0", "agent_1": "p1"}},
    resources={
        "num_workers": 1,
        "num_envs_per_worker": 2,
        "num_cpus_per_worker": 0.25,
        "num_learners": 2,
        "num_cpus_per_learner": 0.25,
        "learner_collective_timeout_s": 20,
    },
)


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


def _replicas(group) -> list[dict]:
    """Every replica's weights once all batches sent are learned (each has taken the same steps)."""
    group.wait_idle()
    return [group.group.call(i, "get_weights") for i in sorted(group.group.actor_ids)]


def _train_until(algo, done, max_iters: int = 200) -> dict:
    result: dict = {}
    for _ in range(max_iters):
        result = algo.train()
        if done(result):
            break
    return result


def test_each_learning_policy_plans_its_own_learners():
    plan = {g.name: g for g in APPO.resource_plan(APPOConfig(**SMALL))}
    assert plan["p0 learner"].count == 2 and plan["p1 learner"].count == 2 and plan["p0 learner"].cpus == 0.25
    assert "learner" not in plan
    frozen = APPOConfig(**{**SMALL, "multi_agent": {**SMALL["multi_agent"], "policies_to_train": ["p0"]}})
    assert [g.name for g in APPO.resource_plan(frozen) if "learner" in g.name] == ["p0 learner"]  # p1 learns not


@pytest.mark.ray
def test_two_policies_each_trained_by_two_learners_keep_identical_replicas(ray_cluster):
    algo = APPOConfig(**SMALL).build()
    try:
        initial = algo.get_weights()
        result = _train_until(algo, lambda r: r["num_learner_results"] >= 4 and r["num_updates"] >= 6)
        keys = sorted(k for k in result if k.startswith("learner/"))
        assert result["num_learners"] == 2 and "learner/p0/entropy" in keys and "learner/p1/entropy" in keys, keys
        groups = algo.learner_groups
        assert sorted(groups) == ["p0", "p1"]
        replicas = {pid: _replicas(group) for pid, group in groups.items()}
        for pid, (r0, r1) in replicas.items():
            assert _equal(r0, r1), pid  # the group's two replicas took the same steps
            assert not _equal(r0, initial[pid]), pid  # and trained
        assert not _equal(replicas["p0"][0], replicas["p1"][0])  # each policy its own weights
        weights = algo.get_weights()
        assert _equal(weights["p0"], replicas["p0"][0]) and _equal(weights["p1"], replicas["p1"][0])
        algo.broadcast_weights()  # each group's learner 0 publishes {its policy: weights}
        for _ in range(200):
            algo.thread.drain(timeout_s=0.05)
            if not any(g._weights_asked for g in groups.values()):
                break
        algo.publisher.send()  # deliver now rather than with the next sample request
        (played,) = algo.env_runners.foreach("get_weights")
        assert _equal(played["p0"], replicas["p0"][0]) and _equal(played["p1"], replicas["p1"][0])
    finally:
        algo.stop()


@pytest.mark.ray
def test_a_sigkilled_replica_of_one_policy_is_replaced_and_training_goes_on(ray_cluster):
    algo = APPOConfig(**SMALL).build()
    try:
        _train_until(algo, lambda r: r["num_learner_results"] >= 2)
        algo.update_config({"lr": 0.0005})  # travels with each group's next round
        group = algo.learner_groups["p1"]
        victim = group.group.call(1, "pid")
        os.kill(victim, signal.SIGKILL)
        updates = group.num_updates
        result = _train_until(algo, lambda r: group.num_regroups >= 1 and group.num_updates >= updates + 4)
        assert group.num_regroups == 1 and group.group.num_restarts == 1, result
        assert result["num_learner_regroups"] == 1 and result["num_learner_restarts"] == 1  # summed over groups
        assert group.group.call(1, "pid") != victim
        assert algo.learner_groups["p0"].num_regroups == 0  # the other policy's group went on undisturbed
        for pid, g in algo.learner_groups.items():
            r0, r1 = _replicas(g)
            assert _equal(r0, r1), pid  # the re-formed group's replicas are identical again
            states = [g.group.call(i, "get_state") for i in sorted(g.group.actor_ids)]
            lrs = [st["learner"]["optimizer"]["param_groups"][0]["lr"] for st in states]
            assert lrs == [0.0005, 0.0005], (pid, lrs)  # the recreated learner too
    finally:
        algo.stop()


@pytest.mark.ray
def test_a_frozen_policy_has_no_group_and_a_checkpoint_resumes_the_learning_ones(ray_cluster, tmp_path):
    cfg = APPOConfig(**{**SMALL, "multi_agent": {**SMALL["multi_agent"], "policies_to_train": ["p0"]}})
    algo = cfg.build()
    try:
        initial = algo.get_weights()
        _train_until(algo, lambda r: r["num_learner_results"] >= 3)
        assert list(algo.learner_groups) == ["p0"]
        r0, r1 = _replicas(algo.learner_groups["p0"])
        assert _equal(r0, r1) and not _equal(r0, initial["p0"])
        saved = algo.get_weights()
        assert _equal(saved["p0"], r0) and _equal(saved["p1"], initial["p1"])  # the frozen one never moved
        path = algo.save(tmp_path)
    finally:
        algo.stop()
    resumed = cfg.build()
    try:
        resumed.restore(path)
        assert _equal(resumed.get_weights()["p0"], saved["p0"])  # before the learners start: the driver's copy
        _train_until(resumed, lambda r: r["num_learner_results"] > 0)
        r0, r1 = _replicas(resumed.learner_groups["p0"])
        assert _equal(r0, r1) and not _equal(r0, saved["p0"])  # trained on from there
    finally:
        resumed.stop()


@pytest.mark.ray
def test_too_many_learners_for_the_cluster_fail_naming_the_parts_and_keys(ray_cluster):
    # 2 policies x 2 learners x 0.5 CPU + 0.25 for the rollout actor: 2.25 CPUs of the cluster's 2
    cfg = APPOConfig(**{**SMALL, "resources": {**SMALL["resources"], "num_cpus_per_learner": 0.5}})
    algo = cfg.build()
    try:
        with pytest.raises(ResourceError) as info:
            algo.train()  # the rollout actors start, and the run reserves its bundles
    finally:
        algo.stop()
    msg = str(info.value)
    assert "needs 2.25 CPUs" in msg and "2 p0 learners x 0.5 CPU" in msg and "2 p1 learners x 0.5 CPU" in msg, msg
    assert "resources.num_cpus_per_learner" in msg and "resources.num_learners" in msg, msg
