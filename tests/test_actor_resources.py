"""ActorResources: one record for what an actor group reserves and where it goes."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import last_json_line

from shoal.algorithms.ppo import PPOConfig
from shoal.config import ResourcesConfig
from shoal.errors import ConfigError
from shoal.runtime import ActorResources, make_actor_group

HERE = Path(__file__).parent


def test_of_workers_takes_the_run_resources_and_applies_changes():
    res = ResourcesConfig(
        num_workers=3, num_cpus_per_worker=0.5, max_worker_restarts=7, resource_wait_s=12.0, address="auto"
    )
    r = ActorResources.of_workers(res)
    assert (r.num_cpus, r.num_gpus, r.max_restarts, r.resource_wait_s, r.address) == (0.5, 0.0, 7, 12.0, "auto")
    shard = ActorResources.of_workers(res, num_cpus=0.0, node="driver")
    assert (shard.num_cpus, shard.node, shard.max_restarts) == (0.0, "driver", 7)
    assert r.node is None  # replace() copies; the original is unchanged


def test_bad_values_are_named():
    with pytest.raises(ValueError, match="'PACK' or 'SPREAD'"):
        ActorResources(strategy="STRICT")
    with pytest.raises(ValueError, match="num_cpus=-1"):
        ActorResources(num_cpus=-1)
    with pytest.raises(TypeError, match="num_cpu"):
        ActorResources().replace(num_cpu=1)


def test_make_actor_group_accepts_the_record_or_single_fields():
    class Echo:
        def __init__(self, i):
            self.i = i

        def who(self):
            return self.i

    group = make_actor_group(Echo, 2, lambda i: ((i,), {}), remote=False, resources=ActorResources(num_cpus=0.5))
    assert group.foreach("who") == [1, 2]
    with pytest.raises(TypeError):
        make_actor_group(Echo, 1, lambda i: ((i,), {}), remote=False, num_cpu=1)  # a typo is not swallowed


def test_restart_budget_counts_a_rolling_window():
    from shoal.runtime.restarts import RestartBudget

    now = [0.0]
    budget = RestartBudget(max_restarts=3, window_s=60.0, clock=lambda: now[0])
    assert [budget.take() for _ in range(3)] == [True, True, True]  # t=0: three restarts
    assert not budget.take()  # a fourth within 60 s is refused
    now[0] = 59.0
    assert not budget.take() and budget.in_window() == 3
    now[0] = 60.0  # the three of t=0 leave the window
    assert budget.in_window() == 0 and budget.take()
    now[0] = 100.0
    assert budget.take() and budget.take() and not budget.take()  # t=60, 100, 100 fill it again
    now[0] = 120.5  # t=60 has left; t=100 twice remains
    assert budget.in_window() == 2 and budget.take()


def test_restart_budget_outlasts_a_lifetime_count():
    """An env that kills its actor every 2 s for an hour: 1,800 restarts, at most 300 in any 600 s window."""
    from shoal.runtime.restarts import RestartBudget

    now = [0.0]
    slow = RestartBudget(max_restarts=300, window_s=600.0, clock=lambda: now[0])
    granted = []
    for k in range(1800):
        now[0] = 2.0 * k
        granted.append(slow.take())
    assert all(granted)
    fast = RestartBudget(max_restarts=300, window_s=600.0, clock=lambda: now[0])
    now[0] = 0.0
    assert sum(fast.take() for _ in range(400)) == 300  # 400 deaths at once: the 301st stops the run


def test_worker_restart_window_reaches_the_actor_resources():
    res = ResourcesConfig(max_worker_restarts=5, worker_restart_window_s=30.0)
    r = ActorResources.of_workers(res)
    assert (r.max_restarts, r.restart_window_s) == (5, 30.0)
    with pytest.raises(ValueError, match="restart_window_s"):
        ActorResources(restart_window_s=0)


def test_worker_placement_reaches_the_rollout_actors_resources():
    assert ActorResources.of_workers(ResourcesConfig()).strategy == "PACK"
    assert ActorResources.of_workers(ResourcesConfig(worker_placement="SPREAD")).strategy == "SPREAD"
    with pytest.raises(ConfigError, match="resources.worker_placement") as e:
        PPOConfig(env="CartPole-v1", resources={"worker_placement": "STRICT_SPREAD"})
    assert "'PACK'" in str(e.value) and "'SPREAD'" in str(e.value) and "STRICT_SPREAD" in str(e.value)


def test_a_lost_node_is_said_in_one_line():
    from ray.exceptions import ActorDiedError, ActorUnavailableError

    from shoal.runtime.ray_group import failure_summary

    node_gone = (
        "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n\tclass_name: "
        "EnvRunner\nThe actor died because its node has died. Node Id: 2384\n\tthe actor's node was terminated "
        "unexpectedly: health check failed due to missing too many heartbeats"
    )
    assert failure_summary(ActorDiedError(), node_gone) == "was lost with its node (the Ray node it ran on died)"
    plain = "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n\tclass_name: X"
    assert (
        failure_summary(ActorDiedError(), plain)
        == "failed (ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.)"
    )
    unreachable = ActorUnavailableError(
        "The actor is temporarily unavailable: RpcError: Connection reset by peer", None
    )
    assert failure_summary(unreachable, str(unreachable)).startswith("is unreachable")


@pytest.mark.ray
def test_an_actor_on_a_lost_node_comes_back_where_there_is_room_or_the_run_stops_saying_why():
    """In its own process: a ``ray.cluster_utils.Cluster`` needs its own Ray instance."""
    room, no_room = last_json_line(HERE / "node_loss_multinode.py").values()
    # One actor on each node (SPREAD); the side node's actor is recreated on the head, in the re-placed bundle.
    assert room["before"] == sorted([room["head"], room["side"]])
    assert room["after"] == [room["head"], room["head"]] and room["restarts"] >= 1
    # With no room left on the head, the restart stops the run after resource_wait_s and says why.
    assert no_room["before"] == sorted([no_room["head"], no_room["side"]])
    msg = no_room.get("error") or ""
    assert "cannot be recreated" in msg and "node that is gone" in msg and "resources.resource_wait_s" in msg, no_room
    assert "--workers" in msg and "Last failure:" in msg, msg  # what to do, and the last failure
