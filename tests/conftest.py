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


def restart_ray_if_placement_is_stuck() -> None:
    """A fresh Ray instance for the tests that follow when the current one no longer places
    placement groups (``shoal.runtime.cluster.placement_groups_schedule``: ray-project/ray#64693)."""
    import ray

    from shoal import runtime
    from shoal.runtime.cluster import placement_groups_schedule

    if ray.is_initialized() and not placement_groups_schedule():
        runtime.shutdown()
        runtime.start(num_cpus=2)
