"""An actor group losing a node of a simulated two-node Ray cluster.

Run by ``tests/test_real_cluster.py`` in a fresh Python process (a ``ray.cluster_utils.Cluster``
needs its own Ray instance). Two 1-CPU actors in a SPREAD placement group, one per node; the
non-head node is then removed (its processes killed). Twice:

- ``room``: the head has 2 CPUs, so Ray re-places the lost bundle there and the group's
  restart recreates the actor on the head;
- ``no_room``: the head has 1 CPU, held by the other actor, so the lost bundle cannot come
  back and the restart stops with a WorkerError saying why, after ``resource_wait_s``.

Prints one JSON line with what happened in each case.
"""

from __future__ import annotations

import json
import sys
import time


class Where:
    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


def lose_a_node(head_cpus: int, deadline_s: float = 60.0) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    from shoal.errors import WorkerError
    from shoal.runtime import ActorResources, make_actor_group

    fast = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": head_cpus, "_system_config": fast})
    side = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, include_dashboard=False, logging_level="ERROR")
    out: dict = {"head": ray.get_runtime_context().get_node_id(), "side": side.node_id}
    try:
        res = ActorResources(num_cpus=1, strategy="SPREAD", resource_wait_s=3.0, address=cluster.address)
        group = make_actor_group(Where, 2, lambda i: ((), {}), remote=True, resources=res, name="test actor")
        out["before"] = sorted(group.foreach("node"))
        cluster.remove_node(side, allow_graceful=False)
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            try:
                nodes = group.foreach("node")
            except WorkerError as e:
                out["error"] = str(e)
                break
            if len(nodes) == 2 and set(nodes) == {out["head"]}:
                out["after"] = nodes
                break
            time.sleep(0.2)
        out["restarts"] = group.num_restarts
        group.stop()
    finally:
        ray.shutdown()
        cluster.shutdown()
    return out


if __name__ == "__main__":
    print(json.dumps({"room": lose_a_node(head_cpus=2), "no_room": lose_a_node(head_cpus=1)}))
    sys.exit(0)
