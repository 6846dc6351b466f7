"""An IMPALA learner group on a simulated three-node Ray cluster: learners on other nodes than the
rollout actor, so fragments (by reference) and weights cross nodes.

Run by ``tests/test_learner_group.py`` in a fresh Python process (a ``ray.cluster_utils.Cluster``
needs its own Ray instance). Three nodes of 1 CPU each; the rollout actor and the two learners reserve 1 CPU each (the
driver's process reserves none outside Tune), so each lands on a node of its own. Prints one JSON line: the nodes of the driver, the rollout actor and the learners,
what training did, and whether the replicas are equal.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> dict:
    import numpy as np
    import ray
    import torch
    from ray.cluster_utils import Cluster

    from shoal.algorithms.impala import IMPALAConfig

    torch.set_num_threads(1)
    t0 = time.time()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, include_dashboard=False, logging_level="WARNING")
    out: dict = {"cluster_start_s": round(time.time() - t0, 1)}
    try:
        cluster.wait_for_nodes()
        out["num_nodes"] = len([n for n in ray.nodes() if n["Alive"]])
        out["driver_node"] = ray.get_runtime_context().get_node_id()
        cfg = IMPALAConfig(
            env="CartPole-v1",
            seed=0,
            lr=0.002,
            rollout_fragment_length=50,
            train_batch_size=500,
            min_time_s_per_iteration=0.5,
            resources={
                "address": cluster.address,
                "num_workers": 1,
                "num_cpus_per_worker": 1.0,
                "num_envs_per_worker": 5,
                "num_learners": 2,
                "num_cpus_per_learner": 1.0,
                "resource_wait_s": 60.0,
                "learner_collective_timeout_s": 30.0,
            },
        )
        algo = cfg.build()
        try:
            result: dict = {}
            for _ in range(40):
                result = algo.train()
                if result.get("num_learner_results", 0) >= 20:
                    break
            group = algo.learner_group
            out["runner_nodes"] = sorted(set(algo.env_runners.node_ids().values()))
            out["learner_nodes"] = [group.group.node_ids()[i] for i in sorted(group.group.actor_ids)]
            out["num_learner_results"] = result.get("num_learner_results", 0)
            out["env_steps_trained"] = algo.counters["env_steps_trained"]
            out["episode_return_mean"] = result.get("episode_return_mean")
            group.wait_idle()
            w = [group.group.call(i, "get_weights") for i in sorted(group.group.actor_ids)]
            out["replicas_equal"] = all(np.array_equal(w[0][k], w[1][k]) for k in w[0])
            out["lost_fragments"] = result.get("num_lost_fragments", 0)
        finally:
            algo.stop()
    finally:
        ray.shutdown()
        cluster.shutdown()
    return out


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
    sys.exit(0)
