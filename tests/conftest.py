import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray instance (2 CPUs, like the CI machine) shared by every Ray test."""
    import os
    from pathlib import Path

    from shoal import runtime

    # Ray workers inherit the environment: let them import classes defined in test modules.
    here = str(Path(__file__).parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    runtime.start(num_cpus=2)
    yield
    runtime.shutdown()


def placement_groups_schedule(timeout_s: float = 20.0) -> bool:
    """Whether Ray still places a new placement group: a tiny one, waited for and removed.

    Removing a placement group while Ray prepares it can leave Ray's placement-group scheduler
    stuck on it, so no later group is ever placed (ray-project/ray#64693, open): a Tune
    experiment's end removes the groups it staged, and the next test's run then waits forever.
    """
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group([{"CPU": 0.01}])
    ready = pg.wait(timeout_seconds=timeout_s)
    remove_placement_group(pg)
    return bool(ready)


def restart_ray_if_placement_is_stuck() -> None:
    """A fresh Ray instance for the tests that follow when the current one no longer places groups."""
    import ray

    from shoal import runtime

    if ray.is_initialized() and not placement_groups_schedule():
        runtime.shutdown()
        runtime.start(num_cpus=2)
