"""ActorResources: one record for what an actor group reserves and where it goes."""

from __future__ import annotations

import pytest

from shoal.config import ResourcesConfig
from shoal.runtime import ActorResources, make_actor_group


def test_of_workers_takes_the_run_resources_and_applies_changes():
    res = ResourcesConfig(num_workers=3, num_cpus_per_worker=0.5, max_worker_restarts=7, resource_wait_s=12.0,
                          address="auto")
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
