"""A run's one placement group on a simulated three-node Ray cluster: where do its bundles land?

Run by ``tests/test_tune.py`` in a spawned Python process (a ``ray.cluster_utils.Cluster`` needs
its own Ray instance). The head (the driver's node) has 2 CPUs, node "a" 2 CPUs, node "gpu"
2 CPUs and 2 (fake) GPUs. Prints one JSON line: for a plan of two GPU learner shards spread
over the nodes plus two rollout actors, the node of every bundle; for a plan with replay shards
pinned to the driver's node, the same; for three CPU-only learner shards, the same; and the error for a GPU plan larger than the cluster.
"""

from __future__ import annotations

import json
import sys


def bundle_nodes(ray, placement) -> dict[str, list[str]]:
    """Each planned group's bundles -> the node ids they were placed on."""
    table = ray.util.placement_group_table(placement.pg)
    where = table["bundles_to_node_id"]
    return {name: [where[i] for i in idx] for name, idx in placement.indices.items()}


def main() -> dict:
    import ray
    from ray.cluster_utils import Cluster

    from shoal.errors import ResourceError
    from shoal.runtime.placement import DRIVER, BundleGroup, RunPlacement

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    cluster.add_node(num_cpus=2)
    gpu_node = cluster.add_node(num_cpus=2, num_gpus=2)
    ray.init(address=cluster.address, include_dashboard=False, logging_level="WARNING")
    try:
        cluster.wait_for_nodes()
        out: dict = {"driver_node": ray.get_runtime_context().get_node_id(), "gpu_node": gpu_node.node_id}
        shards = BundleGroup("learner shard", 2, 0.5, 1.0, spread=True)
        spread = RunPlacement([BundleGroup(DRIVER, 1, 1.0), shards, BundleGroup("rollout actor", 2, 0.5)]).reserve()
        out["gpu_spread"] = bundle_nodes(ray, spread)
        spread.release()
        cpu_shards = BundleGroup("learner shard", 3, 1.0, spread=True)
        spread = RunPlacement([BundleGroup(DRIVER, 1, 1.0), cpu_shards]).reserve()
        out["cpu_spread"] = bundle_nodes(ray, spread)
        spread.release()
        pinned = RunPlacement(
            [
                BundleGroup(DRIVER, 1, 1.0),
                BundleGroup("replay shard", 2, 0.5, node=DRIVER),
                BundleGroup("rollout actor", 3, 1.0),
            ]
        ).reserve()
        out["pinned"] = bundle_nodes(ray, pinned)
        pinned.release()
        try:
            RunPlacement([BundleGroup("learner shard", 3, 0.5, 1.0, spread=True)], what="This league").reserve()
        except ResourceError as e:
            out["too_big"] = str(e)
        return out
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    print(json.dumps(main()))
    sys.stdout.flush()
