"""Ape-X on a simulated two-node Ray cluster: where do the replay shards land?

Run by ``tests/test_apex.py`` in a fresh Python process (a ``ray.cluster_utils.Cluster``
needs its own Ray instance, apart from the test session's). The driver's node (the head)
has 1 CPU, the other node 2. Prints one JSON line: the driver's and the other node's ids,
the node ids of the replay shards (placed with no CPUs: node affinity; with CPUs: a
placement group pinned to the driver's node), the rollout actors' nodes, what training
did; then, for shards that reserve 2 CPUs in all (more than the driver's node has): the
error when they are pinned to the driver's node, and where they land, and that training
runs, when they are not.
"""

from __future__ import annotations

import json
import sys
import time


def train_until_learning(algo) -> dict:
    """A few iterations, until replay batches were requested and learned on."""
    r: dict = {}
    for _ in range(20):
        r = algo.train()
        if r["env_steps_trained"] > 0:
            break
        time.sleep(0.2)
    return r


def wait_until_idle(ray, timeout_s: float = 30.0) -> None:
    """Until every CPU is free again: a stopped run's actors give theirs back asynchronously."""
    deadline = time.time() + timeout_s
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources().get("CPU", 0) and time.time() < deadline:
        time.sleep(0.2)


def main() -> dict:
    import ray
    import torch
    from ray.cluster_utils import Cluster

    from shoal.algorithms.apex import ApeXConfig
    from shoal.errors import NodeResourceError

    torch.set_num_threads(1)
    t0 = time.time()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, include_dashboard=False, logging_level="WARNING")
    out: dict = {"cluster_start_s": round(time.time() - t0, 1)}
    try:
        cluster.wait_for_nodes()
        out["num_nodes"] = len([n for n in ray.nodes() if n["Alive"]])
        out["driver_node"] = ray.get_runtime_context().get_node_id()
        out["other_node"] = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != out["driver_node"])
        preset = ApeXConfig.small_machine_preset()
        base = {**preset, "env": "CartPole-v1", "seed": 0, "min_time_s_per_iteration": 0.0, "learning_starts": 0}
        base["resources"] = {**preset["resources"], "address": cluster.address, "resource_wait_s": 20.0}

        # 1) the preset: shards reserve no CPUs (pinned by node affinity)
        algo = ApeXConfig(**base).build()
        try:
            out["shard_nodes"] = sorted(set(algo.shards.node_ids().values()))
            out["runner_nodes"] = sorted(set(algo.env_runners.node_ids().values()))
            r = train_until_learning(algo)
            out["env_steps_sampled"], out["env_steps_trained"] = r["env_steps_sampled"], r["env_steps_trained"]
        finally:
            algo.stop()

        # 2) shards that reserve CPUs: a placement group on the driver's node (1 CPU there, both shards fit)
        cfg = base | {"resources": {**base["resources"], "replay_shard_cpus": 0.5, "num_workers": 1}}
        algo = ApeXConfig(**cfg).build()
        try:
            out["shard_nodes_with_cpus"] = sorted(set(algo.shards.node_ids().values()))
        finally:
            algo.stop()

        # 3) shards reserving 1 CPU each, 2 in all: the driver's node has 1, the other node 2
        wait_until_idle(ray)  # so that only the other node can hold both
        big = {**base["resources"], "replay_shard_cpus": 1.0, "num_workers": 1}
        pinned = ApeXConfig(**(base | {"resources": big})).build()  # actors start with the first train()
        try:  # a) pinned there (the default): a clear error at once, not a wait for resources
            pinned.start_actors()
            out["pinned_error"] = None
        except NodeResourceError as e:
            out["pinned_error"] = str(e)
        finally:
            pinned.stop()
        # b) not pinned: the placement group goes where it fits, the other node; training works across nodes
        algo = ApeXConfig(**(base | {"resources": {**big, "replay_shards_on_driver_node": False}})).build()
        try:
            out["unpinned_shard_nodes"] = sorted(set(algo.shards.node_ids().values()))
            out["unpinned_runner_nodes"] = sorted(set(algo.env_runners.node_ids().values()))
            out["unpinned_env_steps_trained"] = train_until_learning(algo)["env_steps_trained"]
        finally:
            algo.stop()
    finally:
        ray.shutdown()
        cluster.shutdown()
    out["total_s"] = round(time.time() - t0, 1)
    return out


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
    sys.exit(0)
