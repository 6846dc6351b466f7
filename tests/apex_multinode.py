"""Ape-X on a simulated two-node Ray cluster: where do the replay shards land?

Run by ``tests/test_apex.py`` in a fresh Python process (a ``ray.cluster_utils.Cluster``
needs its own Ray instance, apart from the test session's). Prints one JSON line:
the driver's node id, the node ids of the replay shards (placed with no CPUs: node
affinity; and with CPUs: a placement group pinned to the driver's node), the rollout
actors' nodes, and what one training iteration did.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> dict:
    import ray
    import torch
    from ray.cluster_utils import Cluster

    from shoal.algorithms.apex import ApeXConfig

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
        preset = ApeXConfig.small_machine_preset()
        base = {**preset, "env": "CartPole-v1", "seed": 0, "min_time_s_per_iteration": 0.0, "learning_starts": 0}
        base["resources"] = {**preset["resources"], "address": cluster.address, "resource_wait_s": 20.0}

        # 1) the preset: shards reserve no CPUs (pinned by node affinity)
        algo = ApeXConfig(**base).build()
        try:
            out["shard_nodes"] = sorted(set(algo.shards.node_ids().values()))
            out["runner_nodes"] = sorted(set(algo.env_runners.node_ids().values()))
            r = {}
            for _ in range(20):  # until replay batches were requested and learned on
                r = algo.train()
                if r["env_steps_trained"] > 0:
                    break
                time.sleep(0.2)
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

        # 3) turning the pinning off is a valid config
        off = ApeXConfig(**(base | {"resources": {**base["resources"], "replay_shards_on_driver_node": False}}))
        out["unpinned_config_ok"] = off.resources.replay_shards_on_driver_node is False
    finally:
        ray.shutdown()
        cluster.shutdown()
    out["total_s"] = round(time.time() - t0, 1)
    return out


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
    sys.exit(0)
