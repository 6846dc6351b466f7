"""Distributed learners: the shard arithmetic, batch replay, slots, Ray actors, restarts, colocation."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from shoal.batch import Col
from shoal.errors import ConfigError
from shoal.learn.distributed_learners import DistributedLearners, ShardPlan, shard_plan
from shoal.replay import BatchReplay
from shoal.replay.batch_replay import num_to_replay

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from dlearners_multinode import TRUE_W, PolicyLearner, make_module, mse_loss, regression_batch  # noqa: E402

torch.set_num_threads(1)
CTOR = ((make_module, mse_loss), {"lr": 0.05})


# ---- the arithmetic --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "gpus, policies, shards, expect",
    [
        (4, 10, None, (4, 1.0, 0.4, 3)),  # 1 GPU per shard over 2.5 policies
        (8, 3, None, (3, 2.0, 2.0, 1)),  # 8 / 3 = 2.667 floored to 2 per shard
        (8, 2, None, (2, 4.0, 4.0, 1)),
        (2, 5, None, (2, 1.0, 0.4, 3)),
        (0, 5, None, (5, 0.0, 0.0, 1)),  # no GPUs: one shard per policy, on the CPU
        (4, 10, 8, (8, 0.5, 0.4, 2)),  # more shards than GPUs: each gets a fraction
        (1, 4, 2, (2, 0.5, 0.25, 2)),
        (2, 5, 5, (5, 0.4, 0.4, 1)),
        (8, 3, 2, (2, 4.0, 2.0, 2)),  # 4 / 1.5 = 2.667 GPUs per policy floored to whole GPUs
        (0.5, 3, None, (1, 0.5, 0.1666, 3)),  # under one GPU: one shard with the fraction
    ],
)
def test_shard_plan_matches_hand_computed_values(gpus, policies, shards, expect):
    plan = shard_plan(gpus, policies, shards)
    assert (plan.num_shards, plan.gpus_per_shard, plan.gpus_per_policy, plan.policies_per_shard) == pytest.approx(
        expect
    )
    caps = plan.shard_capacities()
    assert len(caps) == plan.num_shards and sum(caps) == policies and max(caps) == plan.policies_per_shard


@pytest.mark.parametrize("gpus, policies, shards", [(4, 10, 8), (1, 4, 2), (2, 5, 5), (3, 6, 4)])
def test_a_user_given_shard_count_keeps_all_gpus_in_use(gpus, policies, shards):
    plan = shard_plan(gpus, policies, shards)
    assert plan.num_shards == shards
    assert plan.gpus_per_shard * shards == pytest.approx(gpus)
    assert plan.gpus_per_policy * policies == pytest.approx(gpus)
    dl = DistributedLearners(PolicyLearner, BatchReplay, plan, remote=False)
    assert sum(b["GPU"] for b in dl.resource_bundles()) == pytest.approx(gpus)


def test_replay_lost_stays_one_object_through_pickling():
    """A learner in another process returns it through Ray: the driver must still recognise it."""
    import pickle

    from shoal.learn.distributed_learners import REPLAY_LOST, ReplayLost

    assert pickle.loads(pickle.dumps(REPLAY_LOST)) is REPLAY_LOST
    assert isinstance(REPLAY_LOST, ReplayLost) and not isinstance("replay actor lost", ReplayLost)


def test_shard_capacities_spread_the_policies_evenly():
    assert ShardPlan(4, 1.0, 0.4, 3, 10).shard_capacities() == [3, 3, 2, 2]
    assert shard_plan(0, 3).shard_capacities() == [1, 1, 1]


@pytest.mark.parametrize(
    "args, named",
    [
        ((-1, 4), "num_gpus=-1"),
        ((math.nan, 4), "num_gpus=nan"),
        (("2", 4), "num_gpus='2'"),
        ((2, 0), "max_policies=0"),
        ((2, 2.5), "max_policies=2.5"),
        ((2, 4, 0), "num_shards=0"),
        ((2, 4, 5), "num_shards=5"),
        ((2, 4, 1.5), "num_shards=1.5"),
    ],
)
def test_bad_shard_plan_input_is_a_config_error_naming_the_value(args, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        shard_plan(*args)


def test_num_to_replay_carries_the_fraction():
    assert num_to_replay(1, 0.0) == (0, 0.0)
    assert num_to_replay(1, 0.5) == (1, pytest.approx(0.0))
    assert num_to_replay(2, 0.75)[0] == 6
    counts, carry = [], 0.0
    for _ in range(6):  # replay_ratio 0.25: one replayed batch per three new ones
        k, carry = num_to_replay(1, 0.25, carry)
        counts.append(k)
    assert counts == [0, 0, 1, 0, 0, 1]


# ---- batch replay ------------------------------------------------------------------------------
def _tagged(tag: float, n: int = 2):
    b = regression_batch(n)
    b[Col.REWARDS][:] = tag
    return b


def test_batch_replay_without_replay_returns_new_batches_in_order():
    r = BatchReplay(capacity=3, replay_ratio=0.0)
    assert r.replay("a") is None
    r.add_batch("a", _tagged(1))
    r.add_batch("a", _tagged(2))
    r.add_batch("b", _tagged(9))
    assert [r.replay("a")[Col.REWARDS][0], r.replay("a")[Col.REWARDS][0], r.replay("a")] == [1, 2, None]
    assert r.replay("b")[Col.REWARDS][0] == 9
    assert r.stats()["a"] == {"added": 2, "learned_new": 2, "replayed": 0, "waiting": 0, "stored": 2}


def test_batch_replay_mixes_old_batches_at_the_ratio_within_capacity():
    r = BatchReplay(capacity=2, replay_ratio=0.5, seed=0)
    r.add_batch("a", _tagged(1))
    first = r.replay("a")  # nothing stored yet: the new batch alone
    assert list(first[Col.REWARDS]) == [1, 1]
    for t in (2, 3, 4):
        r.add_batch("a", _tagged(t))
        out = r.replay("a")
        assert len(out) == 4 and out[Col.REWARDS][0] == t and out[Col.REWARDS][2] < t  # new + one older batch
    s = r.stats()["a"]
    assert (s["stored"], s["replayed"], s["learned_new"]) == (2, 3, 4)  # the ring keeps `capacity` batches
    r.add_batch("a", _tagged(5))
    assert set(r.replay("a")[Col.REWARDS][2:]) <= {3.0, 4.0}
    r.remove_policy("a")
    assert r.replay("a") is None and "a" not in r.stats()


def test_batch_replay_waiting_batches_are_bounded_and_ratio_one_only_replays():
    r = BatchReplay(capacity=2, replay_ratio=0.0)
    for t in range(5):
        r.add_batch("a", _tagged(t))
    assert r.stats()["a"]["waiting"] == 2 and r.stats()["a"]["stored"] == 2  # oldest moved to the ring unlearned
    assert r.replay("a")[Col.REWARDS][0] == 3
    only_old = BatchReplay(capacity=2, replay_ratio=1.0, seed=1)
    assert only_old.replay("a") is None
    for t in (1, 2, 3):
        only_old.add_batch("a", _tagged(t))
    assert {only_old.replay("a")[Col.REWARDS][0] for _ in range(20)} == {2.0, 3.0}
    with pytest.raises(ConfigError, match="replay_ratio=1.5"):
        BatchReplay(replay_ratio=1.5)


# ---- devices ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "gpus, policies, shards, expect",
    [
        (0, 3, None, ["cpu", "cpu", "cpu"]),
        (2, 4, None, ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]),  # 2 shards x 2 slots, half a GPU each
        (4, 10, None, ["cuda:0"] * 3 + ["cuda:1"] * 3 + ["cuda:2"] * 2 + ["cuda:3"] * 2),
        (8, 3, 2, ["cuda:0", "cuda:2", "cuda:4"]),  # 4 GPUs per shard, 2 per policy: a slot starts at its own GPUs
        (1, 4, 2, ["cuda:0"] * 4),  # one GPU shared by both shards
    ],
)
def test_each_slot_trains_on_the_gpu_its_shard_was_given(gpus, policies, shards, expect):
    plan = shard_plan(gpus, policies, shards)
    got = [plan.slot_device(s, j) for s, cap in enumerate(plan.shard_capacities()) for j in range(cap)]
    assert got == expect


class _DeviceRecorder(PolicyLearner):
    def __init__(self, policy_id, replay, *args, device="cpu", **kwargs):
        self.given_device = device  # recorded, not resolved: this machine has no GPU
        super().__init__(policy_id, replay, *args, **kwargs)


def test_in_process_learners_get_their_slots_device_and_a_missing_gpu_is_a_config_error():
    dl = DistributedLearners(_DeviceRecorder, BatchReplay, shard_plan(2, 4), remote=False)
    for p in "abcd":
        dl.add_policy(p, *CTOR)
    assert [dl.get_policy_actor(p).given_device for p in "abcd"] == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]
    dl.stop()
    from shoal.learn.distributed_learners import resolve_learner_device

    assert str(resolve_learner_device("cpu")) == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="cuda:1 but torch sees no CUDA device"):
            resolve_learner_device("cuda:1")


@pytest.mark.parametrize(
    "gpu_id, visible, index", [(3, "3", 0), ("5", "2,5", 1), (1, None, 1), (2, "", 2), (4, "0,1", 4)]
)
def test_a_ray_assigned_gpu_id_maps_to_its_torch_index(gpu_id, visible, index):
    from shoal.runtime import cuda_index

    assert cuda_index(gpu_id, visible) == index


# ---- slots, in-process -------------------------------------------------------------------------
def test_slots_first_free_full_error_remove_and_reuse_in_process():
    dl = DistributedLearners(PolicyLearner, BatchReplay, shard_plan(0, 5, num_shards=2), remote=False)
    assert [dl.add_policy(p, *CTOR) for p in "abcde"] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    assert dl.num_free_slots() == 0
    with pytest.raises(ConfigError, match=r"cannot add policy 'f': the league is full, all 5 learner slots"):
        dl.add_policy("f", *CTOR)
    with pytest.raises(ValueError, match="'a' already has a learner"):
        dl.add_policy("a", *CTOR)
    w_b = dl.get_weights(["b"])["b"]
    removed = dl.remove_policy("b")
    assert all(np.array_equal(removed[k], w_b[k]) for k in w_b)
    assert dl.num_free_slots() == 1 and "b" not in dl.policy_ids
    with pytest.raises(KeyError, match="'b' has no learner"):
        dl.get_policy_actor("b")
    assert dl.add_policy("f", *CTOR, weights=removed) == (0, 1)  # the freed slot, from the given weights
    assert all(np.array_equal(dl.call("f", "get_weights")[k], w_b[k]) for k in w_b)
    dl.remove_policy("d")
    assert dl.add_policy("g", *CTOR) == (1, 0)
    bundles = dl.resource_bundles()
    assert len(bundles) == 2 + 5 and bundles[0] == {"CPU": 0.0, "GPU": 0.0}
    dl.stop()


def test_in_process_learners_learn_from_their_shards_replay():
    dl = DistributedLearners(
        PolicyLearner, BatchReplay, shard_plan(0, 2), remote=False, replay_kwargs={"capacity": 8, "replay_ratio": 0.5}
    )
    for pid in ("a", "b"):
        dl.add_policy(pid, *CTOR)
    assert dl.get_replay_actor("a") is not dl.get_replay_actor("b")  # one shard each
    assert dl.get_policy_actor("a").replay is dl.get_replay_actor("a")
    proxies = dl.replay_proxies()
    losses = []
    for it in range(60):
        proxies["a"].add_batch("a", regression_batch(seed=it))
        assert dl.submit("a", "learn") and not dl.submit("a", "learn")  # one request in flight at most
        ((pid, stats),) = dl.fetch_ready()
        assert pid == "a"
        losses.append(stats["loss"])
    assert losses[-1] < 0.2 * losses[0]
    assert stats["rows"] == 64  # a new batch plus a replayed one
    assert dl.call("b", "learn") is None  # nothing was sent to b's shard
    w = dl.get_weights()["a"]["weight"][0]
    assert np.abs(w - TRUE_W).max() < np.abs(TRUE_W).max()  # moving toward the true weights
    assert dl.replay_stats()["a"]["learned_new"] == 60
    dl.stop()


# ---- Ray ------------------------------------------------------------------------------------------
def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.ray
def test_ray_learner_restarts_from_latest_weights_and_slots_stay_on_the_shard_node(ray_cluster):
    import ray

    dl = DistributedLearners(
        PolicyLearner,
        BatchReplay,
        shard_plan(0, 2),
        remote=True,
        replay_kwargs={"capacity": 4, "replay_ratio": 0.5},
        replay_num_cpus=0.1,
        policy_num_cpus=0.1,
        max_restarts=3,
    )
    try:
        for pid in ("a", "b"):
            dl.add_policy(pid, *CTOR)
        proxies = dl.replay_proxies()
        for it in range(3):
            for pid in ("a", "b"):
                proxies[pid].add_batch(pid, regression_batch(seed=it))  # fire-and-forget, as rollout actors do
        assert dl.get_replay_actor("a").stats()["a"]["waiting"] == 3  # same caller: the adds came first
        for pid in ("a", "b"):
            assert dl.submit(pid, "learn")
        got = {}
        deadline = time.time() + 60
        while len(got) < 2 and time.time() < deadline:
            got.update(dl.fetch_ready(timeout_s=1.0))
        assert set(got) == {"a", "b"} and all(s["num_updates"] == 1 for s in got.values())

        latest = dl.get_weights(["a"])["a"]  # the driver has now seen these
        assert dl.call("a", "learn")["num_updates"] == 2  # ... and the actor moves on past them
        assert not _same(dl.call("a", "get_weights"), latest)
        dead = dl.get_policy_actor("a").handle
        ray.kill(dead, no_restart=True)
        deadline = time.time() + 30
        while time.time() < deadline:  # ray.kill is asynchronous: a call right after it may still reach the old actor
            try:
                ray.get(dead.__ray_ready__.remote(), timeout=5)
                time.sleep(0.1)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                break
        assert _same(dl.call("a", "get_weights"), latest)  # recreated, then given the latest weights
        assert dl.num_restarts == 1
        assert dl.call("a", "num_updates") == 0  # a fresh actor ...
        assert dl.call("a", "learn")["num_updates"] == 1  # ... that learns from the same replay actor

        nodes = dl.node_ids()
        assert nodes["policies"]["a"] == nodes["replay"][0] and nodes["policies"]["b"] == nodes["replay"][1]
        dl.remove_policy("b")
        with pytest.raises(ConfigError, match="league is full"):
            dl.add_policy("c", *CTOR)
            dl.add_policy("d", *CTOR)
        assert dl.where["c"] == (1, 0)  # b's freed slot
        assert dl.node_ids()["policies"]["c"] == nodes["replay"][1]
        assert dl.call("c", "learn") is None  # b's replay data left with b
    finally:
        dl.stop()


@pytest.mark.ray
def test_policy_learners_sit_on_their_replay_actors_node_in_a_three_node_cluster():
    """In its own process: a ``ray.cluster_utils.Cluster`` needs its own Ray instance."""
    path = os.pathsep.join(p for p in (str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, str(HERE / "dlearners_multinode.py")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": path},
        cwd=HERE.parent,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1])
    assert out["num_nodes"] == 3
    replay = out["replay_nodes"]
    assert len(set(replay.values())) == 3  # shards spread over the nodes
    assert len(out["policies"]) == 6
    for pid, p in out["policies"].items():
        assert p["node"] == replay[str(p["shard"])], pid
    assert sorted(p["shard"] for p in out["policies"].values()) == [0, 0, 1, 1, 2, 2]
    assert all(out["learned"].values())
    gpu = out["gpu_learners"]  # each GPU learner: its own GPU id, which torch sees as cuda:0 in its process
    assert {p["spec"] for p in gpu.values()} == {"assigned-gpu"}
    assert sorted(p["gpu_ids"][0] for p in gpu.values()) == ["0", "1"]
    assert all(p["visible"] == p["gpu_ids"][0] and p["resolved"] == "cuda:0" for p in gpu.values()), gpu
